"""The analysis traces the reference on the meta device: the same ops, FLOPs and bytes as a real run,
with no memory and no GPU time; a reference that needs real values falls back to the device."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbrain.core.problem import shape_label
from kernelbrain.core.protocol import Fit

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
    from kernelbrain.child import analysis, loading

    source = path.read_text()
    result = analysis.analyse(source, "cpu")
    assert result["traced_on"] == "meta"
    # as a run's later child: handed the analysis's fits (checked against the reference there)
    loading.give_fits(source, [Fit(**f) for f in result["fits"]])
    problem = loading.Problem(source)
    shape = problem.ladder_shapes("cpu", "primary")[0]
    loading.give_fits(source, [])
    assert [shape_label(shape)] == result["rung_shapes"]
    ref, _ = loading.build(problem, None, shape, "cpu")
    assert result["ops"] == analysis.record_calls(ref, problem.inputs(shape, 0, "cpu"))
    flops, nbytes = analysis.count(problem, shape, "cpu")
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
    from kernelbrain.child import analysis

    result = analysis.analyse(NEEDS_VALUES, "cpu")
    assert result["traced_on"] == "cpu"
    assert [op["op"] for op in result["ops"]][-1] == "softmax"  # torch.rand draws values in [0, 1)
    assert result["bytes"] == 2 * 8 * 64 * 4


# an __init__ that mixes a numpy array with a fresh tensor: built on the meta device it would add a
# host tensor to a meta one and fail, so it is built on the host and moved
NEEDS_HOST = """
import numpy as np
import torch
import torch.nn as nn

KB_SHAPES = [{"n": 16}]
n = 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.from_numpy(np.arange(16.0, dtype=np.float32)) + torch.ones(16))

    def forward(self, x):
        return torch.softmax(x * self.w, dim=1)


def get_inputs():
    return [torch.rand(4, n)]


def get_init_inputs():
    return []
"""


def test_a_model_whose_init_needs_the_host_is_built_there_and_moved() -> None:
    from kernelbrain.child import analysis, loading

    result = analysis.analyse(NEEDS_HOST, "cpu")
    assert result["traced_on"] == "meta"
    assert [op["op"] for op in result["ops"]] == ["mul", "softmax"]
    ref, _ = loading.build(loading.Problem(NEEDS_HOST), None, {"n": 16}, "meta")
    assert ref.w.device.type == "meta"


# KernelBench's softmax at its own size (4096 x 393216 float32, 6 GiB an input), counted on the meta device
BIG_SOFTMAX = """
import torch
import torch.nn as nn

batch_size = 4096
dim = 393216


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
"""


def test_a_gate_reserves_what_its_fitted_shapes_hold_not_a_benchs() -> None:
    """A bench at the file's size holds five inputs, the reference's peak (its output) and the candidate's
    output: 7 x 6 GiB; the gate runs at shapes fitted to its budget, and reserves what they hold
    (device_room: eight gatekeepers each reserving a bench's 42 GiB would gate one at a time)."""
    from kernelbrain.child import analysis, loading

    problem = loading.Problem(BIG_SOFTMAX)
    one = 4096 * 393216 * 4
    assert analysis.footprint(problem, "cuda") == 7 * one
    gate = analysis.gate_footprint(problem, "cuda")
    assert 0 < gate < one / 16, gate / 2**20  # fitted: tens of MiB
    (shape,) = problem.gate_shapes("cuda")
    rows, cols = shape.get("batch_size", 4096), shape.get("dim", 393216)
    assert gate == 7 * rows * cols * 4


def test_a_profile_reserves_one_run_at_the_primary_shape_not_a_benchs() -> None:
    """A profile (the roofline, an ncu target) runs the candidate once at the file's size: its input
    once, and what the run writes (the reference's peak, its output, and the candidate's output) twice
    for ncu's replay: 5 x 6 GiB of the bench's 7 (an H100's ncu target of it held 24.7 GiB)."""
    from kernelbrain.child import analysis, loading

    problem = loading.Problem(BIG_SOFTMAX)
    one = 4096 * 393216 * 4
    assert analysis.profile_footprint(problem, "cuda") == 5 * one
    assert analysis.footprint(problem, "cuda") == 7 * one


NO_DYNAMO = """
import json, sys
from kernelbrain.child.analysis import analyse
analyse(open(sys.argv[1]).read(), "cpu")
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules}))
"""


@pytest.mark.parametrize("name", ["softmax_small", "bmv_small"])
def test_kbs_own_dispatch_modes_import_no_dynamo(name: str) -> None:
    """kb's dispatch modes run their hooks as written (guard.dynamo_free): TorchDispatchMode's own wrapper
    imports torch._dynamo at a hook's first call, 1.5-2 s of every run's analysis child, and the import
    replaces torch.manual_seed and others as it loads. (torch's own Python meta kernels, a product by a
    scalar's among them, still import it: these problems' ops have none.)"""
    from tests.runs import run_interpreted

    path = Path(__file__).parent / "problems" / f"{name}.py"
    assert run_interpreted(NO_DYNAMO, str(path)) == {"dynamo": False}
