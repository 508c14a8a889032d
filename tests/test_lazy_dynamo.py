"""Meta arithmetic without torch._dynamo's import (kernelbrain/child/lazy_dynamo.py), and dynamo as torch
has it once something loads it."""

from __future__ import annotations

from runs import run_interpreted

META_THEN_DYNAMO = """
import gc, json, sys, types, torch
from kernelbrain.child import lazy_dynamo

def stand_ins():
    return sum(
        1 for o in gc.get_objects()
        if type(o) is types.FunctionType
        and getattr(getattr(o, "__dynamo_disable", None), "__qualname__", "").startswith("_stand_in")
    )

installed = lazy_dynamo.install() if sys.argv[1] == "install" else 0
x = torch.randn(4, 6, device="meta")
shapes = [list((x * 2.0).relu().softmax(-1).sum(0).shape)]
conv = torch.nn.Conv2d(3, 8, 3).to("meta")
shapes.append(list(conv(torch.randn(2, 3, 10, 10, device="meta")).shape))
loaded_by_meta = "torch._dynamo" in sys.modules

import torch._dynamo  # now something loads it: torch's own wrappers take over

calls = []
def backend(gm, example_inputs):
    calls.append(len(gm.graph.nodes))
    return gm.forward
compiled = torch.compile(lambda a: (a * 2.0).sin() + 1.0, backend=backend)
ok = torch.allclose(compiled(torch.ones(5)), torch.ones(5).mul(2.0).sin() + 1.0)
before = stand_ins()
shapes.append(list((x - 3.0).shape))  # not traced above: its stand-in steps aside for the real one
print(json.dumps({"installed": installed, "loaded_by_meta": loaded_by_meta, "shapes": shapes,
                  "compiled": bool(ok) and len(calls) == 1, "left": [before, stand_ins()]}))
"""


def test_meta_arithmetic_leaves_dynamo_unloaded_and_dynamo_works_once_loaded() -> None:
    got = run_interpreted(META_THEN_DYNAMO, "install")
    assert got["installed"] > 50, got  # torch's reference implementations, among others
    assert got["loaded_by_meta"] is False, got
    assert got["shapes"] == [[6], [2, 8, 8, 8], [4, 6]], got
    assert got["compiled"] is True, got
    before, after = got["left"]
    assert 0 < after < before <= got["installed"], got  # the multiplication's now torch's own


def test_without_the_stand_ins_meta_arithmetic_loads_dynamo() -> None:
    """What install() saves: torch's wrapper imports torch._dynamo on the first meta multiplication."""
    got = run_interpreted(META_THEN_DYNAMO, "plain")
    assert got["installed"] == 0 and got["loaded_by_meta"] is True, got
    assert got["shapes"] == [[6], [2, 8, 8, 8], [4, 6]] and got["compiled"] is True, got
