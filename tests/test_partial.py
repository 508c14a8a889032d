"""Partial kernels, labelled (`kb run --allow-torch`): the classes of torch ops (core/torch_ops.py), the
graph cut at them (templates/compose/partial.py), the expert generator's labelled proposals, the gate
admitting exactly the allowed ATen ops (a labelled candidate that also runs torch.matmul, or registers its
own kernel for an allowed op, is refused; the same candidate unlabelled is refused), the GPU launch check's
attribution of kernels to the allowed ops (from profiler records), and the sweep's table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from pydantic import ValidationError

from kernelbrain.core import torch_ops
from kernelbrain.core.events import ProblemAnalysed, RunConfig
from kernelbrain.core.protocol import GateRequest
from kernelbrain.generators import GenerationError
from kernelbrain.generators.expert import ExpertGenerator
from kernelbrain.runtime.runner import DEFAULT_RUNGS
from kernelbrain.templates.compose import partial
from tests.composed import graph_of
from tests.kbcli import kb, kb_env

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "tests" / "problems" / "partial_conv_transpose_norm.py"


def test_classes_parse_and_name_their_ops() -> None:
    assert torch_ops.parse("matmul, conv,conv") == ("conv", "matmul")
    assert torch_ops.parse("") == ()
    with pytest.raises(torch_ops.UnknownClass, match="'bogus' is not a class of torch ops; choose from conv"):
        torch_ops.parse("conv,bogus")
    assert torch_ops.class_of("aten.convolution.default") == "conv"
    assert torch_ops.class_of("addmm") == "matmul"
    assert torch_ops.class_of("aten.native_group_norm.default") == "norm"
    assert torch_ops.class_of("aten.relu.default") is None
    # ops that fuse more than the class's own compute are in none
    assert torch_ops.class_of("_addmm_activation") is torch_ops.class_of("cudnn_convolution_relu") is None
    assert RunConfig(rungs=DEFAULT_RUNGS["cpu"], allow_torch=("norm", "conv")).allow_torch == ("conv", "norm")
    with pytest.raises(ValidationError):
        RunConfig(rungs=DEFAULT_RUNGS["cpu"], allow_torch=("gemm",))


class ConvNormSwish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose3d(3, 8, 3, stride=2, output_padding=1)
        self.norm = nn.GroupNorm(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x))
        return x * torch.sigmoid(x) * 2.0


class LinearTail(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return torch.relu(y - y.amax(dim=1, keepdim=True)) + r


def test_the_graph_is_cut_at_the_allowed_ops() -> None:
    graph = graph_of(ConvNormSwish().to("meta"), (2, 3, 3, 3, 4))
    spec = partial.compose(graph, ("conv", "matmul"))
    assert spec["classes"] == ["conv"]
    assert [graph.nodes[j].op for j in spec["head"]] == ["aten.convolution.default"]
    assert spec["tail"]["family"] == "moments" and spec["tail"]["then"]["family"] == "pointwise"

    graph = graph_of(LinearTail().to("meta"), (4, 6), (4, 5))
    spec = partial.compose(graph, ("matmul",))
    assert spec["classes"] == ["matmul"]
    assert [graph.nodes[j].op for j in spec["head"]] == ["aten.t.default", "aten.addmm.default"]
    assert spec["tail"]["sources"] == [["input", 1]]


@pytest.mark.parametrize(
    ("fn", "allowed", "why"),
    [
        (lambda x, w: torch.relu(x @ w), ("conv",), r"no op of the allowed classes \(conv\)"),
        (lambda x, w: torch.relu((x * 2) @ w), ("matmul",), "aten.mul.Tensor before the matmul op"),
        (lambda x, w: x @ w, ("matmul",), "nothing is left for Triton"),
        # a view with sizes (traced at one shape, wrong at the gate's others) may not lead to a torch op
        (lambda x, w: torch.relu(x.reshape(4, 6) @ w), ("matmul",), "aten.view.default before the matmul"),
    ],
    ids=["not-allowed", "compute-before", "nothing-after", "sized-view"],
)
def test_what_cannot_be_cut_is_refused_with_why(fn, allowed, why) -> None:
    graph = graph_of(fn, (2, 2, 6) if "view" in why else (4, 6), (6, 5))
    with pytest.raises(partial.NotPartial, match=why):
        partial.compose(graph, allowed)


LINEAR_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x, r):
        y = self.fc(x)
        return torch.relu(y - y.amax(dim=1, keepdim=True)) + r

def get_inputs():
    return [torch.randn(4, 6), torch.randn(4, 5)]

def get_init_inputs():
    return []
"""


def test_a_rendered_matmul_partial_candidate_passes_the_gate_labelled_only(box) -> None:
    graph = graph_of(LinearTail().to("meta"), (4, 6), (4, 5))
    spec = partial.refine(partial.compose(graph, ("matmul",)), LINEAR_PROBLEM)
    assert spec is not None
    knobs = partial.round0(spec)[0]
    assert knobs["torch"] == "matmul" and knobs["tail"] == spec["tail"]["family"]
    text = partial.render(spec, knobs, {"init": [], "forward": ["x", "r"]})
    assert "torch.ops.aten.addmm.default(" in text and "TORCH_OPS = ['matmul']" in text
    args = {"problem_source": LINEAR_PROBLEM, "cand_source": text, "device": "cpu", "seeds": 2}
    r = box.call(GateRequest(**args, torch_ops=["matmul"]), timeout_s=300)[0]
    assert r.passed is True, r
    r = box.call(GateRequest(**args, torch_ops=["conv"]), timeout_s=300)[0]  # the wrong label
    assert r.passed is False and r.category == "policy" and "ATen addmm" in (r.detail or ""), r


def _analysis(model: nn.Module, *shapes: tuple[int, ...]) -> ProblemAnalysed:
    graph = graph_of(model.to("meta"), *shapes)
    return ProblemAnalysed(
        ops=[], families=[], flops=0, bytes=0, shapes=[], graph=graph,
        signature={"init": ["in_channels", "out_channels", "kernel_size", "groups"], "forward": ["x"]},
    )  # fmt: skip


def test_the_expert_generator_labels_partial_candidates() -> None:
    analysis = _analysis(ConvNormSwish(), (2, 3, 3, 3, 4))
    source = PROBLEM.read_text()
    # all in Triton, the conv_transpose family composes it (the norm and the Swish its tail): unlabelled
    whole = ExpertGenerator().first_round(analysis, problem_source=source)
    assert whole and all(p.family == "conv_transpose" and not p.torch_ops for p in whole)
    with pytest.raises(GenerationError, match="no op of the allowed classes"):
        ExpertGenerator(allow_torch=("matmul",)).partial_spec(analysis, source)
    proposals = ExpertGenerator(allow_torch=("conv",)).first_round(analysis, problem_source=source)
    partials = [p for p in proposals if p.family == "partial"]
    assert 1 <= len(partials) <= partial.ROUND0_MAX and proposals[: len(partials)] == partials  # first
    assert all(p.torch_ops == ["conv"] for p in partials) and proposals[len(partials) :] == whole
    parent = partials[0]
    moves = ExpertGenerator(allow_torch=("conv",)).mutate(
        analysis, parent.knobs, "partial", ["latency or occupancy-limited"], problem_source=source
    )
    assert all(m.torch_ops == ["conv"] and m.knobs != parent.knobs for m in moves)


# --- the gate: exactly the allowed ATen ops ------------------------------------------------------------

CONV_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))

def get_inputs():
    return [torch.randn(2, 3, 6, 6)]

def get_init_inputs():
    return []
"""

CONV_CANDIDATE = """
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl

{top}

@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        h = F.conv2d(x, self.conv.weight, self.conv.bias).contiguous()
{extra}
        y = torch.empty_like(h)
        relu_kernel[(triton.cdiv(h.numel(), 256),)](h, y, h.numel(), BLOCK=256)
        return y
"""
HONEST = CONV_CANDIDATE.format(top="", extra="")
# a conv-labelled candidate that secretly also runs torch.matmul (an identity: the values do not change)
MATMUL = CONV_CANDIDATE.format(
    top="", extra="        h = torch.matmul(h, torch.eye(h.shape[-1])).contiguous()"
)
# one that registers its own CPU kernel for aten::convolution, doing the relu in torch inside it
REGISTERS = CONV_CANDIDATE.format(
    top="""
_LIB = torch.library.Library("aten", "IMPL")

def _conv_relu(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    out = torch.ops.aten._convolution.default(
        x, w, b, stride, padding, dilation, transposed, output_padding, groups, False, False, True, True
    )
    return torch.relu(out)

_LIB.impl("convolution", _conv_relu, "CPU")
""",
    extra="",
)


@pytest.mark.parametrize(
    ("source", "allowed", "words"),
    [
        (HONEST, [], "forward computes with torch"),
        (MATMUL, ["conv"], "beyond what it is labelled to keep in torch (conv)"),
        (REGISTERS, ["conv"], "registered its own kernel for aten::convolution"),
    ],
    ids=["unlabelled", "conv-label-runs-matmul", "conv-label-registers-a-kernel"],
)
def test_the_gate_admits_exactly_the_allowed_ops(box, source: str, allowed: list[str], words: str) -> None:
    args = {"problem_source": CONV_PROBLEM, "cand_source": source, "device": "cpu", "seeds": 1}
    r = box.call(GateRequest(**args, torch_ops=allowed), timeout_s=300)[0]
    assert r.passed is False and r.category == "policy", r
    assert words in (r.detail or ""), r.detail
    if source is MATMUL:
        assert "ATen" in r.detail and ("mm" in r.detail or "matmul" in r.detail), r.detail


def test_the_honest_labelled_twin_passes(box) -> None:
    args = {"problem_source": CONV_PROBLEM, "cand_source": HONEST, "device": "cpu", "seeds": 1}
    r = box.call(GateRequest(**args, torch_ops=["conv"]), timeout_s=300)[0]
    assert r.passed is True, r


# --- the GPU launch check's attribution, on the profiler's records (no GPU needed) -----------------------


def test_kernels_are_attributed_to_the_allowed_ops_that_launched_them() -> None:
    from torch.profiler import DeviceType

    from kernelbrain.child import launches

    secret = "kb_allowed_x"

    def host(name, corr, start, end, thread=1):
        return SimpleNamespace(
            name=name, device_type=DeviceType.CPU, correlation_id=corr, linked_correlation_id=0,
            start_ns=start, end_ns=end, start_thread_id=thread,
        )  # fmt: skip

    def kernel(name, linked, start):
        return SimpleNamespace(
            name=name, device_type=DeviceType.CUDA, correlation_id=0, linked_correlation_id=linked,
            start_ns=start, end_ns=start + 1, activity_type="kernel", is_user_annotation=False,
        )  # fmt: skip

    events = [
        host(secret, 1, 100, 200),
        host("aten::cudnn_convolution", 2, 110, 190),  # inside the bracket
        host("aten::mm", 3, 300, 400),  # outside: the candidate's own torch.matmul
        host(secret, 4, 500, 600, thread=2),  # a bracket on another thread covers nothing here
        host("aten::add", 5, 510, 520, thread=1),
        kernel("sm90_xmma_fprop_implicit_gemm_cudnn", 2, 1000),
        kernel("sm90_xmma_gemm_f32f32_cublas", 3, 1100),
        kernel("relu_kernel", 99, 1200),  # its Triton kernel: launched by no op
        kernel("at::native::CUDAFunctor_add", 5, 1300),
    ]
    got = launches.attribute(events, secret)
    assert got == [
        ("sm90_xmma_fprop_implicit_gemm_cudnn", True),
        ("sm90_xmma_gemm_f32f32_cublas", False),
        ("relu_kernel", False),
        ("at::native::CUDAFunctor_add", False),
    ]
    outside = [n for n, inside in got if not inside]
    assert launches.classify(outside, {"relu_kernel"}) == [
        "sm90_xmma_gemm_f32f32_cublas",
        "at::native::CUDAFunctor_add",
    ]


# --- the sweep's table --------------------------------------------------------------------------------


def test_the_sweep_passes_allow_torch_and_marks_partial_winners(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from tools import kernelbench_sweep as sweep

    folder = tmp_path / "kb" / "level2"
    folder.mkdir(parents=True)
    for name in ("1_Conv_Norm.py", "2_Gemm_Relu.py"):
        (folder / name).write_text("# a problem\n")
    out = tmp_path / "out"
    (out / "level2").mkdir(parents=True)
    base = {
        "level": 2,
        "finished": True,
        "families": [],
        "candidates": 2,
        "gate_passed": 1,
        "gate_failed": {},
    }
    base |= {"winner": "c1", "gpu_s": 1.0, "speedup": {"vs_eager": 1.5, "vs_compile": 0.9}, "timing": {}}
    rows = [
        {**base, "problem": "1_Conv_Norm", "file": "level2/1_Conv_Norm.py", "winner_family": "partial",
         "winner_torch_ops": ["conv"]},
        {**base, "problem": "2_Gemm_Relu", "file": "level2/2_Gemm_Relu.py", "winner_family": "contraction"},
    ]  # fmt: skip
    for r in rows:
        (out / "level2" / f"{r['problem']}.json").write_text(json.dumps(r))
    args = argparse.Namespace(
        kernelbench=tmp_path / "kb", levels=[2], only=None, out=out, budget_gpu_s=60.0, max_candidates=8,
        repeats=20, allow_torch="conv", device="cpu", gpu={"name": "cpu", "driver": ""},
    )  # fmt: skip
    sweep.table(args, sweep.level_counts(args))
    text = (out / "README.md").read_text()
    assert "--allow-torch conv`" in text
    assert "| 2 | 2/2 (1 partial) |" in text, text
    assert "| level2/1_Conv_Norm.py | partial [torch: conv] |" in text
    assert "| level2/2_Gemm_Relu.py | contraction |" in text
    assert "1 winners are partial kernels" in text
    cmd = sweep.kb_run_command([folder / "1_Conv_Norm.py"], tmp_path / "s.db", args)
    assert cmd[cmd.index("--allow-torch") + 1] == "conv"
    args.allow_torch = ""
    assert "--allow-torch" not in sweep.kb_run_command([folder / "1_Conv_Norm.py"], tmp_path / "s.db", args)


# --- end to end: kb run --allow-torch conv, then the labels in events, audit and export ---------------


def test_kb_run_allow_torch_reaches_a_labelled_gate_passing_candidate(tmp_path: Path) -> None:
    db = str(tmp_path / "kb.db")
    env = kb_env(TRITON_INTERPRET="1")
    args = ["--db", db, "--device", "cpu", "--allow-torch", "conv", "--max-candidates", "1", "--inprocess"]
    r = kb("run", str(PROBLEM), *args, "--ladder", "smallest:1:0", env=env, timeout=600)
    assert r.returncode == 0, (r.stdout, r.stderr)
    run_id = r.stdout.split()[1]
    assert "torch allowed for conv" in r.stdout and "[torch: conv]" in r.stdout, r.stdout
    events = [
        json.loads(line) for line in kb("events", run_id, "--db", db, "--json", env=env).stdout.splitlines()
    ]
    (started,) = [e for e in events if e["type"] == "RunStarted"]
    assert started["payload"]["config"]["allow_torch"] == ["conv"]  # recorded: kb resume keeps it
    (proposed,) = [e for e in events if e["type"] == "CandidateProposed"]
    assert proposed["payload"]["torch_ops"] == ["conv"] and proposed["payload"]["family"] == "partial"
    # its plan: the torch head, then the tail's launches, the last writing what forward returns
    plan = proposed["payload"]["plan"]
    assert [(p["stage"], p["family"]) for p in plan] == [
        ("head", "torch"),
        ("tail", "moments"),
        ("tail", "pointwise"),
    ]
    assert plan[0]["reads"][:2] == ["x", "self.conv.weight"] and plan[1]["reads"][0] == plan[0]["writes"]
    assert plan[-1]["writes"] == "kb_h"
    assert any(e["type"] == "GatePassed" for e in events)
    audit = kb("audit", run_id, "--db", db, env=env).stdout
    assert (
        "torch allowed for conv (--allow-torch)" in audit and "Runs in torch: conv (a partial kernel" in audit
    )
    assert "Plan: 3 launches" in audit and "  head: torch (torch=conv) reads x, self.conv.weight" in audit
    assert "  tail: pointwise (strategy=tile" in audit and "-> kb_h" in audit
    out = tmp_path / "kernel.py"
    assert kb("export", run_id, "--db", db, "-o", str(out), env=env).returncode == 0
    head = out.read_text().split('"""', 1)[0]
    assert (
        "# PARTIAL KERNEL: keeps conv in PyTorch" in head and "torch.ops.aten.convolution" in out.read_text()
    )
