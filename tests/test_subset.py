"""kb's candidate subset (kernelbrain/core/subset.py): every family's renders are within it (round 0 and
every mutation, over the render table: `outside_subset`, run by tests/test_render_hashes.py, which
renders the table anyway), so a template's source as an LLM sees it for a mutation is too; each way
around an allowlist is refused, naming its line; what the templates legitimately need beyond the subset
comes from the candidate API (kernelbrain/candidate.py), which `kb export` copies in."""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from kernelbrain import candidate
from kernelbrain.core import subset
from kernelbrain.generators.base import Proposal
from kernelbrain.views.export import inline_api
from tests.red_team.test_subset_cheats import HONEST, cheat

NUMBERS = re.compile(r"\b\d+\b")


def outside_subset(renders: Iterable[tuple[str, Proposal]]) -> list[str]:
    """The renders outside the subset, as 'key: refusal'. Each distinct text is checked once, with its
    numbers folded (the checker reads no number's value: knob sets that differ only in numbers are one
    case to it). tests/test_render_hashes.py calls this on every render of the table (every family's
    round 0 and every mutation), which it renders anyway: that is the proof the issue asks for, that a
    template's source as an LLM sees it for a mutation fits the subset."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    shapes: set[tuple[str, tuple[str, ...]]] = set()
    refused = []
    for key, p in renders:
        what = (p.source, tuple(p.torch_ops))
        if what in seen:
            continue
        seen.add(what)
        shape = (NUMBERS.sub("0", p.source), what[1])
        if shape in shapes:
            continue
        shapes.add(shape)
        found = subset.check(p.source, p.torch_ops)
        if found is not None:
            refused.append(f"{key}: {found}")
    return refused


# name: (source, words of its first refusal); each differs from the honest softmax by its trick
ESCAPES: dict[str, tuple[str, str]] = {
    "an import by its name": (cheat(imports="from torch import softmax"), "importing torch.softmax"),
    "torch under numpy's name": (
        cheat(imports="import torch as np", forward="z = np.softmax(x, 1)"),
        "torch.softmax",
    ),
    "a star import": (cheat(imports="from torch import *"), "a star import"),
    "a relative import": (cheat(imports="from . import x"), "a relative import"),
    "an import in a function": (cheat(forward="import os"), "an import inside a function"),
    "a foreign decorator": (
        cheat(top="\n@staticmethod\ndef helper(a):\n    return a\n"),
        "the decorators of helper",
    ),
    "an autotune hook": (
        cheat(
            top="\n@triton.autotune(configs=[triton.Config({}, num_warps=4)], key=['n'], pre_hook=print)\n"
            "@triton.jit\ndef k(n):\n    pass\n"
        ),
        "a decorator argument that is not literal data",
    ),
    "a nested function": (cheat(forward="def inner():\n    return x"), "a nested function"),
    "a walrus": (cheat(forward="ys = [(z := v) for v in range(3)]"), "an assignment expression"),
    "global": (cheat(forward="global torch"), "global"),
    "del": (cheat(forward="del y"), "del"),
    "with in forward": (cheat(forward="with torch.no_grad():\n    z = 1"), "a with statement"),
    "a yield": (cheat(forward="yield y"), "yield"),
    "a module-level statement": (cheat(top="\nif True:\n    LIMIT = 1\n"), "a module-level if statement"),
    "an attribute of another object": (cheat(forward="x.grad = None"), "assigning the attribute x.grad"),
    "into a module constant": (
        cheat(top="\nTABLE = [1, 2]\n", forward="TABLE[0] = 3"),
        "assigning into TABLE",
    ),
    "a tensor at import": (cheat(top="\nBUF = torch.empty(10)\n"), "calling torch.empty"),
    "a module tensor written": (
        cheat(top="\nBUF = (1, 2)\n", forward="BUF.copy_(y)"),
        "calling the method .copy_",
    ),
    "a module constant grown": (cheat(top="\nTABLE = [1, 2]\n", forward="TABLE.append(y)"), ".append"),
    "a builtin rebound": (cheat(forward="len = 3"), "rebinding the builtin 'len'"),
    "a module name rebound": (cheat(forward="triton = 3"), "rebinding the module's name 'triton'"),
    "synchronise": (cheat(forward="torch.cuda.synchronize()"), "calling torch.cuda.synchronize"),
    "numpy of a tensor": (cheat(forward="a = x.numpy()"), "calling the method .numpy"),
    "tolist": (cheat(forward="a = x.tolist()"), "calling the method .tolist"),
    "open": (cheat(forward="f = open('/etc/passwd')"), "calling open"),
    "vars": (cheat(forward="v = vars(x)"), "calling vars"),
    "print": (cheat(forward="print(x)"), "calling print"),
    "an f-string's dunder": (cheat(forward='s = f"{x.__class__}"'), "the dunder attribute .__class__"),
    "format's field access": (cheat(forward='s = "{0.__class__}".format(x)'), "calling the method .format"),
    "a kernel as a value": (cheat(forward="k = softmax_rows"), "the function softmax_rows as a value"),
    "a grid held in a non-tuple": (cheat(forward="g = x.shape", grid="g"), "the launch grid g"),
    "a constexpr's methods in a kernel": (
        cheat(top="\n@triton.jit\ndef k(T: tl.constexpr):\n    s = T.sum()\n"),
        "the attribute .sum of the constexpr T",
    ),
    "a host helper called in a kernel": (
        cheat(top="\ndef helper(a):\n    return a\n", kernel="x = helper(x)"),
        "calling helper in a kernel",
    ),
    "a parameter called in a kernel": (
        cheat(top="\n@triton.jit\ndef k(f):\n    f()\n"),
        "calling f in a kernel",
    ),
    "a matmul without --allow-torch": (cheat(forward="z = torch.matmul(x, x)"), "calling torch.matmul"),
    "a conv without --allow-torch": (
        cheat(imports="import torch.nn.functional as F", forward="z = F.conv1d(x, x)"),
        "calling torch.nn.functional.conv1d",
    ),
    "bytes": (cheat(forward="b = b'x'"), "a bytes literal"),
    "a second class": (cheat(top="\nclass Helper:\n    pass\n"), "class Helper"),
    "a metaclass on ModelNew": (
        HONEST.replace("(nn.Module)", "(nn.Module, metaclass=type)"),
        "ModelNew's bases",
    ),
    "a dunder method": (
        HONEST.replace(
            "    def forward(self, x):",
            "    def __getattr__(self, n):\n        return 1\n\n    def forward(self, x):",
        ),
        "ModelNew.__getattr__",
    ),
    "no ModelNew": (HONEST.replace("class ModelNew", "class Other"), "a module without class ModelNew"),
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_each_escape_is_refused_on_its_line(name: str) -> None:
    source, words = ESCAPES[name]
    found = subset.refusals(source)
    assert found, name
    first = str(found[0])
    assert words in first, (name, [str(f) for f in found])
    assert first.startswith(f"line {found[0].line}: ") and "is outside kb's candidate subset; " in first


ALLOWED = {
    "the honest softmax": (HONEST, ()),
    "annotations": (
        HONEST.replace("def forward(self, x):", "def forward(self, x: torch.Tensor) -> torch.Tensor:"),
        (),
    ),
    "super with its arguments": (
        HONEST.replace("super().__init__()", "super(ModelNew, self).__init__()"),
        (),
    ),
    "the candidate API": (
        cheat(imports="from kernelbrain import candidate", forward="n = candidate.sm_count(x.device) * 4"),
        (),
    ),
    "a Triton dtype handed to a kernel": (
        cheat(top="\nDTYPE = tl.constexpr(1)\n", forward="d = tl.float16"),
        (),
    ),
    "libdevice and tl.math": (cheat(kernel="x = tl.extra.cuda.libdevice.exp(x)\nx = tl.math.exp(x)"), ()),
    "autotune with literal configs": (
        cheat(
            top="\n@triton.autotune(configs=[triton.Config({'B': 64}, num_warps=4)], key=['n'])\n"
            "@triton.jit\ndef k(n, B: tl.constexpr):\n    pass\n"
        ),
        (),
    ),
    "matmul under --allow-torch matmul": (cheat(forward="z = torch.matmul(x, x.t())"), ("matmul",)),
    "aten convolution under --allow-torch conv": (
        cheat(forward="z = torch.ops.aten.convolution.default(x, x, None, [1], [0], [1], False, [0], 1)"),
        ("conv",),
    ),
    "no_grad in the constructor": (
        HONEST.replace(
            "super().__init__()\n",
            "super().__init__()\n        self.w = nn.Parameter(torch.ones(3))\n"
            "        with torch.no_grad():\n            self.w.uniform_(0.5, 1.5)\n",
        ),
        (),
    ),
}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_what_kernels_legitimately_write_is_within_it(name: str) -> None:
    source, classes = ALLOWED[name]
    assert subset.refusals(source, classes) == [], name


def test_a_source_that_does_not_parse_is_left_to_the_gate() -> None:
    """The child says `compile` for it, with Python's own message."""
    assert subset.check("def broken(:\n") is None


def test_the_candidate_api_answers_numbers_only() -> None:
    cpu = torch.device("cpu")
    assert candidate.sm_count(cpu) == 4 and candidate.device_properties(cpu) == {}
    assert candidate.programs_per_sm(None, torch.ones(4), cap=3, num_warps=4) == 3  # off CUDA: the cap
    cache = candidate.LaunchCache()
    assert cache.remember((torch.float32, (8, 200)), (4, 1024)) == (4, 1024)
    assert cache.get((torch.float32, (8, 200))) == (4, 1024) and cache.get("other") is None
    with pytest.raises(TypeError, match="never tensors"):
        cache.remember((8, 200), torch.ones(2))
    assert candidate.aligned(torch.ones(4)) in (True, False)


def test_an_export_of_a_candidate_using_the_api_needs_no_kernelbrain(tmp_path: Path) -> None:
    """`kb export` copies the API in place of its import: the file imports nothing of kb's and runs."""
    source = cheat(imports="from kernelbrain import candidate", forward="n = candidate.sm_count(x.device)")
    inlined = inline_api(source)
    for node in ast.walk(ast.parse(inlined)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not any(m.split(".")[0] == "kernelbrain" for m in mods), ast.unparse(node)
    path = tmp_path / "exported.py"  # a file: @triton.jit reads its kernels' source through inspect
    path.write_text(inlined)
    spec = importlib.util.spec_from_file_location("exported", path)
    assert spec is not None and spec.loader is not None
    exported = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exported)
    assert exported.candidate.sm_count(torch.device("cpu")) == 4
    assert exported.candidate.LaunchCache is not candidate.LaunchCache
