"""The accuracy contract (kernelbrain/core/accuracy.py, child/regime.py): the reference as the user runs it.

No GPU here: a TF32 backend is stood in for by kb's own emulation of one (InRegime, which rounds a
contraction's factors to TF32 and sums in IEEE float32, what a TF32 tensor core does). The measurement
must tell it from IEEE float32 by the error alone, as it tells cuDNN's TF32 algorithms on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kernelbrain.child import regime
from kernelbrain.child.loading import Problem
from kernelbrain.core.accuracy import Accuracy
from kernelbrain.core.problem import in_strict_fp32
from kernelbrain.core.protocol import GateRequest
from kernelbrain.runtime.sandbox import Sandbox
from tests.test_tolerance import BMV, GEMV

HERE = Path(__file__).resolve().parent
aten = torch.ops.aten
TF32 = Accuracy(device="cuda", regimes={"conv": "tf32", "matmul": "tf32"})
BF16 = Accuracy(device="cuda", regimes={"conv": "bf16", "matmul": "bf16"})

CONV = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, c_in, c_out, k):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))

def get_inputs():
    return [torch.randn(2, 8, 20, 20)]

def get_init_inputs():
    return [8, 16, 3]
"""


def _call(func: Any, *shapes: Any, **extra: Any) -> tuple[Any, list[Any]]:
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=g, dtype=torch.float64) if isinstance(s, tuple) else s for s in shapes]
    return func, args


CALLS = {
    "conv2d, channels sliced": _call(
        aten.convolution.default,
        (2, 3, 300, 300),
        (8, 3, 3, 3),
        (8,),
        [1, 1],
        [1, 1],
        [1, 1],
        False,
        [0, 0],
        1,
    ),
    "conv2d grouped": _call(
        aten.convolution.default, (3, 4, 30, 30), (8, 2, 3, 3), (8,), [2, 2], [0, 0], [1, 1], False, [0, 0], 2
    ),
    "conv_transpose2d, channels sliced": _call(
        aten.convolution.default,
        (2, 4, 260, 260),
        (4, 6, 3, 3),
        None,
        [1, 1],
        [0, 0],
        [1, 1],
        True,
        [0, 0],
        1,
    ),
    "conv1d dilated": _call(
        aten.convolution.default, (3, 4, 50), (5, 4, 3), None, [1], [2], [2], False, [0], 1
    ),
    "conv3d": _call(
        aten.convolution.default,
        (2, 2, 8, 8, 8),
        (3, 2, 3, 3, 3),
        (3,),
        [1, 1, 1],
        [0, 0, 0],
        [1, 1, 1],
        False,
        [0, 0, 0],
        1,
    ),
    "mm, rows sliced": _call(aten.mm.default, (200, 50), (50, 1000)),
    "addmm, 1-D bias": _call(aten.addmm.default, (1000,), (200, 50), (50, 1000)),
    "addmm, 2-D bias": _call(aten.addmm.default, (200, 1000), (200, 50), (50, 1000)),
    "bmm": _call(aten.bmm.default, (3, 200, 50), (3, 50, 1000)),
    "baddbmm": _call(aten.baddbmm.default, (3, 200, 1000), (3, 200, 50), (3, 50, 1000)),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_the_sampled_truth_is_the_full_truths_slice(name: str) -> None:
    """The float64 slice the measurement computes equals the same elements of the whole output, and is a
    real part of it where the output is large."""
    func, args = CALLS[name]
    full = func(*args)
    sliced, index = regime.sample(func, args)
    part = func(*sliced)
    assert part.shape == full[index].shape
    torch.testing.assert_close(part, full[index], rtol=1e-12, atol=1e-12)
    if "sliced" in name:
        assert part.numel() < full.numel() // 2


def test_rounding_keeps_each_formats_mantissa() -> None:
    one = torch.tensor([1 + 2**-10, 1 + 2**-11, 1 + 2**-12, -(1 + 2**-11), float("inf"), float("nan")])
    got = regime.rounded(one, "tf32")
    assert got[:4].tolist() == [1 + 2**-10, 1 + 2**-10, 1.0, -(1 + 2**-10)]  # ties away from zero
    assert got[4] == float("inf") and bool(torch.isnan(got[5]))
    cut = regime.rounded(one, "tf32", nearest=False)
    assert cut[:4].tolist() == [1 + 2**-10, 1.0, 1.0, -1.0]
    x = torch.randn(10_000)
    ties = (x.view(torch.int32) & 0xFFFF) == 0x8000  # where bfloat16's ties-to-even differs
    assert torch.equal(regime.rounded(x, "bf16")[~ties], x.bfloat16().float()[~ties])
    assert regime.rounded(x, "ieee") is x and regime.rounded(x.double(), "tf32").dtype == torch.float64


@pytest.mark.parametrize("name", ["conv2d grouped", "conv1d dilated", "mm, rows sliced", "baddbmm"])
@pytest.mark.parametrize("backend", [None, TF32, BF16])
def test_the_measurement_tells_the_format_from_the_error_alone(name: str, backend: Accuracy | None) -> None:
    func, args = CALLS[name]
    specs = tuple(regime.Spec(a.float()) if isinstance(a, torch.Tensor) else a for a in args)
    with regime.InRegime(backend) if backend is not None else torch.no_grad():
        m = regime.measure_one(func, specs, {}, "cpu")
    assert m is not None
    want = "ieee" if backend is None else backend.format_of(m.kind)
    assert m.format == want, m
    if want == "ieee":
        assert m.error < 1e-3 * m.converted["tf32"]
    else:  # the stand-in truncates, as a tensor core fed float32 does
        assert 0.5 < m.error / m.converted[f"{want} truncated"] < 2, m


def test_the_analysis_records_the_regime_and_strict_overrides_it() -> None:
    problem = Problem(CONV)
    shape = problem.ladder_shapes("cpu", "primary")[0]
    ieee = regime.measure(problem, shape, "cpu")
    assert [m.op for m in ieee.measured] == ["convolution"] and ieee.regimes == {}
    assert ieee.summary().startswith("IEEE fp32 reference (cpu)")
    with regime.InRegime(TF32):  # a backend that runs the convolution in TF32
        tf32 = regime.measure(problem, shape, "cpu")
    assert tf32.regimes == {"conv": "tf32"} and 1e-4 < tf32.error < 3e-3
    assert tf32.summary().startswith("cuDNN TF32 reference (cpu): its error ")
    strict = Problem(in_strict_fp32(CONV))
    assert strict.strict_fp32 and not problem.strict_fp32
    with regime.InRegime(TF32):
        held = regime.measure(strict, shape, "cpu")
    assert held.regimes == {"conv": "tf32"} and held.format_of("conv") == "ieee" and held.error == 0.0
    assert held.summary().startswith("IEEE fp32 contractions (--strict-fp32)")


def test_the_reference_in_the_regime_errs_as_the_regime_does() -> None:
    """At a shape the gate checks, the reference's own outputs in a TF32 regime err as TF32 does, and in
    the IEEE regime as IEEE float32 (whatever the flags were)."""
    torch.manual_seed(0)
    problem = Problem(CONV)
    model = problem.module.Model(8, 16, 3)
    x = torch.randn(2, 8, 20, 20)
    truth = model.double()(x.double())
    model.float()
    errs = {}
    for name, acc in (("ieee", Accuracy(device="cpu")), ("tf32", TF32), ("none", None)):
        with torch.no_grad(), regime.in_regime(acc):
            errs[name] = float((model(x).double() - truth).norm() / truth.norm())
    assert errs["ieee"] < 1e-6 and errs["none"] < 1e-6 and 1e-4 < errs["tf32"] < 3e-3, errs


TF32_GEMV = "LOW = True\n" + GEMV.replace(
    "a = a.to(tl.bfloat16).to(tl.float32)",
    "a = ((a.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)",
).replace(
    "x = x.to(tl.bfloat16).to(tl.float32)",
    "x = ((x.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)",
)
BF16_GEMV = "LOW = True\n" + GEMV


def _gate(box: Sandbox, source: str, accuracy: Accuracy | None, problem: str = BMV) -> dict:
    request = GateRequest(
        problem_source=problem, cand_source=source, device="cpu", seeds=3, accuracy=accuracy
    )
    return box.call(request, timeout_s=300)[0].model_dump()


def test_a_tf32_kernel_passes_exactly_where_the_reference_is_tf32(box: Sandbox) -> None:
    """The same TF32 GEMV against the reference in each regime; an IEEE one passes a TF32 regime, a
    bfloat16 one fails it (test_tolerance: the IEEE one passes where no regime is given)."""
    assert TF32_GEMV != BF16_GEMV and "bitcast" in TF32_GEMV
    ieee = _gate(box, TF32_GEMV, Accuracy(device="cuda"))
    assert (ieee["passed"], ieee["category"]) == (False, "mismatch"), ieee
    passed = _gate(box, TF32_GEMV, TF32)
    assert passed["passed"] is True, passed
    strict = _gate(box, TF32_GEMV, TF32.model_copy(update={"strict": True}), problem=in_strict_fp32(BMV))
    assert (strict["passed"], strict["category"]) == (False, "mismatch"), strict
    assert _gate(box, "LOW = False\n" + GEMV, TF32)["passed"] is True
    assert _gate(box, BF16_GEMV, TF32)["passed"] is False
