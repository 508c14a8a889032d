"""The analysis traces the reference on the meta device: the same ops, FLOPs and bytes as a real run,
with no memory and no GPU time; a reference that needs real values falls back to the device."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = sorted(
    [*(ROOT / "benchmarks" / "problems").glob("*.py"), *(ROOT / "tests" / "problems").glob("*.py")]
)

# a reference that branches on a value: .item() has no meaning on the meta device
NEEDS_VALUES = """
import torch
import torch.nn as nn

KB_SHAPES = [{"n": 64}]
n = 64


class Model(nn.Module):
    def forward(self, x):
        if x.max().item() > 0.5:
            return torch.softmax(x, dim=1)
        return torch.exp(x)


def get_inputs():
    return [torch.rand(8, n)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_meta_tracing_counts_what_a_real_run_counts(path: Path) -> None:
    from kernelbrain import evaluate as ev

    source = path.read_text()
    result = ev.analyse(source, "cpu")
    assert result["traced_on"] == "meta"
    problem = ev.Problem(source)
    shape = problem.ladder_shapes("cpu", "primary")[0]
    ref, _ = ev._build(problem, None, shape, "cpu")
    assert result["ops"] == ev._record_calls(ref, problem.inputs(shape, 0, "cpu"))
    flops, nbytes = ev._count(problem, shape, "cpu")
    assert result["bytes"] == nbytes > 0
    if path.stem == "sdp_attn":
        # the CPU's fused attention kernel is one FlopCounterMode does not count (it falls back to
        # counting elements); on meta SDPA decomposes into its two matmuls, which it does count
        q, k, v = problem.inputs(shape, 0, "meta")
        assert result["flops"] == 2 * q.shape[:-2].numel() * q.shape[-2] * k.shape[-2] * (
            q.shape[-1] + v.shape[-1]
        )
        assert result["flops"] > flops
    else:
        assert result["flops"] == flops > 0


def test_a_reference_that_needs_values_is_traced_on_the_device() -> None:
    from kernelbrain import evaluate as ev

    result = ev.analyse(NEEDS_VALUES, "cpu")
    assert result["traced_on"] == "cpu"
    assert [op["op"] for op in result["ops"]][-1] == "softmax"  # torch.rand draws values in [0, 1)
    assert result["bytes"] == 2 * 8 * 64 * 4
