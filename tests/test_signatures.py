"""A rendered ModelNew takes exactly the reference's constructor signature: defaults, keyword-only
parameters, `*args` and `**kwargs` as declared, so KernelBench's loader (`ModelNew(*get_init_inputs())`)
builds it from every call that builds Model. Issue 15's first failure: 24_LogSoftmax declares
`__init__(self, dim: int = 1)` and `get_init_inputs()` returns `[]`."""

from __future__ import annotations

import inspect

import pytest
import torch

from kernelbrain.child.analysis import parameter_texts
from kernelbrain.child.loading import load_module
from kernelbrain.core.protocol import AnalyseRequest, GateRequest
from kernelbrain.templates.families import row_softmax as rs

# (the reference's parameters after self, the defaults ModelNew gets where they differ)
TABLE = [
    ("", {}),
    ("dim: int = 1", {}),
    ("in_features, out_features, bias=True", {}),
    ("a, b=2, *, c, d=(1, 2), e='same'", {}),
    ("*args, **kwargs", {}),
    ("a, /, b, *, c=None", {}),
    ("eps: float = 1e-5, dtype=torch.float16", {}),
    ("n, *shape, scale=0.5", {}),
    ("marker=object()", {"marker": None}),  # only the problem's own object could be that default
]


@pytest.mark.parametrize(("params", "changed"), TABLE, ids=[p or "none" for p, _ in TABLE])
def test_the_rendered_parameters_declare_what_the_reference_does(params: str, changed: dict) -> None:
    scope: dict = {"torch": torch}
    exec(f"def reference(self{', ' if params else ''}{params}): pass", scope)
    texts = parameter_texts(scope["reference"])
    exec(f"def rendered(self{''.join(', ' + t for t in texts)}): pass", scope)
    want = list(inspect.signature(scope["reference"]).parameters.values())
    got = list(inspect.signature(scope["rendered"]).parameters.values())
    assert [(p.name, p.kind) for p in got] == [(p.name, p.kind) for p in want]
    for g, w in zip(got, want, strict=True):
        assert g.default == changed.get(w.name, w.default), (g, w)


LOG_SOFTMAX = """
import torch
import torch.nn as nn

batch_size, dim = 4, 96


class Model(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=self.dim)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""


def test_a_template_for_a_defaulted_constructor_builds_as_kernelbenchs_loader_does(box) -> None:
    analysis = box.call(AnalyseRequest(problem_source=LOG_SOFTMAX, device="cpu"), timeout_s=120)[0]
    signature = analysis.signature.model_dump()
    assert signature["init"] == ["dim"] and signature["params"] == ["dim=1"]
    spec = {"log": True, "dim": 1, "ndim": 2, "n_cols": 96}
    knobs = next(k for k in rs.ROUND0 if rs.feasible(spec, k))
    source = rs.render(spec, knobs, signature)
    module = load_module(source, "sigtest")
    module.ModelNew(*[])  # KernelBench's loader: get_init_inputs() is []
    names_only = load_module(rs.render(spec, knobs, {"init": ["dim"], "forward": ["x"]}), "sigtest")
    with pytest.raises(TypeError, match="dim"):  # what every candidate failed with before
        names_only.ModelNew(*[])
    args = {"problem_source": LOG_SOFTMAX, "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=300)[0]
    assert r.passed, r
