"""The layernorm template family and the row_norm knobs it shares with l2norm: matched from the traced
ops (nn.LayerNorm, F.layer_norm, the hand-written form) and refined from the source, ModelNew holding
Model's parameters under Model's names; every round-0 candidate passes the gate (regular and irregular
row lengths, one and two normalised dims, fp32/fp16/bf16, affine and not); mutations move knobs,
feasibility refuses oversize register tiles; and a whole run ends with a layernorm winner."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbrain.child.loading import load_module
from kernelbrain.core.diagnosis import LABELS
from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.core.protocol import AnalyseRequest, GateRequest
from kernelbrain.generators.expert import ExpertGenerator
from kernelbrain.templates import FAMILIES
from kernelbrain.templates.families import layernorm, row_norm
from tests.parts_check import assert_composed_of_parts, reachable_knobs
from tests.runs import QUICK_RUNGS, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "tests" / "problems"
LAYERNORM = PROBLEMS / "layernorm_small.py"
SMOKE = 'KB_SMOKE_SHAPE = {"batch_size": 3, "features": 5, "dim": 48}'
AFFINE_INIT = """        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)
"""
# problem_variants() and OTHER_PROBLEMS (other families' problems) feed conftest's problems/analyses fixtures
OTHER_PROBLEMS = {
    "softmax": ROOT / "benchmarks" / "problems" / "softmax.py",
    "rmsnorm": ROOT / "benchmarks" / "problems" / "rmsnorm.py",
    "l2norm": PROBLEMS / "l2norm_small.py",
}
# a tile of 64 or 32 elements: several tiles per row, several chunks per row at these row lengths
MULTI_TILE = [
    {"strategy": "looped", "block_n": 64, "num_warps": 2},
    {"strategy": "split", "block_n": 32, "split": 4, "num_warps": 2},
]


def problem_variants() -> dict[str, str]:
    seed = LAYERNORM.read_text()
    assert SMOKE in seed and AFFINE_INIT in seed
    plain = seed.replace(AFFINE_INIT, "").replace(
        "nn.LayerNorm(normalized_shape=normalized_shape)",
        "nn.LayerNorm(normalized_shape=normalized_shape, elementwise_affine=False)",
    )
    return {
        "seed": seed,  # fp32, affine, two normalised dims, D = 240 over 15 rows
        "regular": seed.replace(SMOKE, 'KB_SMOKE_SHAPE = {"batch_size": 4, "features": 4, "dim": 64}'),
        "plain_fp16": plain.replace(
            "torch.randn(batch_size, features, dim)", "torch.randn(batch_size, features, dim).half()"
        ),
        "functional_bf16": (PROBLEMS / "layernorm_functional.py").read_text(),
        "decomposed": (PROBLEMS / "layernorm_decomposed.py").read_text(),
    }


def _spec(analyses: dict, problems: dict, variant: str) -> dict:
    spec = layernorm.refine(layernorm.matches(analyses[variant]["ops"]), problems[variant])
    assert spec is not None, variant
    return spec


def test_matches_layer_norms_and_nothing_else(analyses):
    for name in problem_variants():
        assert [f.FAMILY for f in FAMILIES if f.matches(analyses[name]["ops"]) is not None] == [
            "layernorm"
        ], name
    for name in OTHER_PROBLEMS:
        assert layernorm.matches(analyses[name]["ops"]) is None, name
    ln = {"op": "layer_norm", "ndim": 3, "shape": [3, 5, 48], "dtype": "float32", "eps": 1e-5}
    assert analyses["seed"]["ops"] == [{**ln, "normalized_shape": [5, 48]}]
    seed = layernorm.matches(analyses["seed"]["ops"])
    assert (seed["n_cols"], seed["norm_dims"]) == (240, 2)
    assert layernorm.matches([ln])["min_cols"] == 48  # an older trace: D >= the last dim
    dec = layernorm.matches(analyses["decomposed"]["ops"])
    assert (dec["form"], dec["norm_dims"], dec["n_cols"], dec["has_eps"]) == ("decomposed", 1, 100, True)


def _ops(*names: str, **extra) -> list[dict]:
    x = {"ndim": 3, "shape": [2, 8, 16], "dtype": "float32"}
    return [{"op": n, **x, **extra.get(n, {})} for n in names]


LN = ("mean", "sub", "pow", "add", "sqrt", "div")


@pytest.mark.parametrize(
    ("ops", "why"),
    [
        (_ops(*LN, mean={"dim": -1, "keepdim": True}, pow={"dim": 2}), None),
        (_ops(*LN, mean={"dim": [1, 2], "keepdim": True}, pow={"dim": 2}), None),
        (_ops("mean", "sub", "mul", "add", "rsqrt", mean={"dim": 2, "keepdim": True}), None),
        (_ops(*LN, mean={"dim": 1, "keepdim": True}, pow={"dim": 2}), "an inner dim"),
        (_ops(*LN, mean={"dim": [0, 2], "keepdim": True}, pow={"dim": 2}), "dims not trailing"),
        (_ops(*LN, mean={"dim": -1}, pow={"dim": 2}), "no keepdim"),
        (_ops(*LN, mean={"dim": -1, "keepdim": True}, pow={"dim": 3}), "a cube"),
        (_ops(*LN, "mul", "add", mean={"dim": -1, "keepdim": True}, pow={"dim": 2}), "an affine tail"),
        (
            _ops("mean", "var", "sub", "add", "sqrt", "div", mean={"dim": -1, "keepdim": True}),
            "var: bias unknown",
        ),
        (
            _ops("pow", "mean", "add", "sqrt", "div", pow={"dim": 2}, mean={"dim": -1, "keepdim": True}),
            "rmsnorm",
        ),
        (_ops("layer_norm", "relu"), "more work after"),
        ([{"op": "layer_norm", "ndim": 2, "shape": [4, 8], "dtype": "int64"}], "integers"),
    ],
)
def test_decomposed_spellings_and_near_misses(ops, why):
    spec = layernorm.matches(ops)
    assert (spec is None) == (why is not None), why


def test_refine_reads_what_the_trace_cannot_show(analyses, problems):
    seed = _spec(analyses, problems, "seed")
    assert (seed["shape_expr"], seed["weight_expr"], seed["eps_expr"]) == (
        "self.ln.normalized_shape",
        "self.ln.weight",
        "self.ln.eps",
    )
    assert seed["init_params"] == "normalized_shape"  # the annotation dropped
    assert "super(Model" not in seed["init_body"] and "super().__init__()" in seed["init_body"]
    fn = _spec(analyses, problems, "functional_bf16")
    assert (fn["shape_expr"], fn["weight_expr"], fn["bias_expr"], fn["eps_expr"]) == (
        "(x.shape[-1],)",
        "self.weight",
        "self.bias",
        "self.eps",
    )
    assert fn["init_params"] == "hidden, eps=1e-06"
    assert _spec(analyses, problems, "decomposed")["eps_expr"] == "1e-05"

    ops = analyses["seed"]["ops"]
    spec = layernorm.matches(ops)
    assert layernorm.refine(spec, None) is None  # without the source the parameters are unknown
    glob = problems["seed"].replace(
        "nn.LayerNorm(normalized_shape=normalized_shape)", "nn.LayerNorm(features)"
    )
    assert layernorm.refine(spec, glob) is None, "a module global the candidate cannot see"
    twice = problems["seed"].replace("return self.ln(x)", "return self.ln(self.ln(x))")
    assert layernorm.refine(spec, twice) is None, "the trace keeps one of two identical calls"
    other = problems["seed"].replace("self.ln = nn.LayerNorm(", "self.ln = nn.GroupNorm(1, ")
    assert layernorm.refine(spec, other) is None
    with pytest.raises(ValueError, match="refine"):
        layernorm.render(spec, row_norm.ROUND0[0], analyses["seed"]["signature"])


@pytest.mark.parametrize("variant", ["seed", "functional_bf16"])
def test_model_new_holds_models_parameters_under_the_same_names(analyses, problems, variant):
    spec = _spec(analyses, problems, variant)
    cand = load_module(layernorm.render(spec, row_norm.ROUND0[0], analyses[variant]["signature"]), "cand")
    problem = load_module(problems[variant], "problem")
    init = problem.get_init_inputs()
    ref, new = problem.Model(*init), cand.ModelNew(*init)
    assert {k: v.shape for k, v in new.state_dict().items()} == {
        k: v.shape for k, v in ref.state_dict().items()
    }
    assert ref.state_dict()  # both variants are affine: there is something to copy


# every round-0 knob set on every variant; the multi-tile ones on two irregular variants
CASES = [(v, k) for v in problem_variants() for k in row_norm.ROUND0] + [
    (v, k) for v in ("seed", "decomposed") for k in MULTI_TILE
]


@pytest.mark.parametrize(
    ("variant", "knobs"), CASES, ids=[f"{v}-" + "-".join(str(x) for x in k.values()) for v, k in CASES]
)
def test_round0_candidates_pass_the_gate(box, problems, analyses, variant, knobs):
    spec = _spec(analyses, problems, variant)
    assert layernorm.feasible(spec, knobs)
    source = layernorm.render(spec, knobs, analyses[variant]["signature"])
    assert "layer_norm(" not in source.replace("_layer_norm(", "")  # the kernels do the work
    args = {"problem_source": problems[variant], "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=120)[0].model_dump()
    assert r["passed"] is True, r


@pytest.mark.parametrize("variant", ["seed", "decomposed"])
def test_every_reachable_knob_set_renders_from_the_parts_module(analyses, problems, variant):
    spec = _spec(analyses, problems, variant)
    knob_sets = reachable_knobs(row_norm)
    assert {k["strategy"] for k in knob_sets} == {"registers", "looped", "split"}
    for knobs in knob_sets:
        source = layernorm.render(spec, knobs, analyses[variant]["signature"])
        assert_composed_of_parts(source, row_norm.PARTS, knobs)
        assert f"_row_norm_{knobs['strategy']}_kernel" in source and "_layer_norm(" in source


def test_row_norm_mutations_move_knobs_and_feasibility_refuses_oversize_tiles():
    assert set(row_norm.MUTATIONS) == set(LABELS)
    for knobs in row_norm.ROUND0:
        for moves in row_norm.MUTATIONS.values():
            for move, why in moves:
                child = row_norm.mutate(knobs, move)
                assert why and (child is None or child != knobs), (knobs, move)
    reg = {"strategy": "registers", "rows": 1, "num_warps": 4}
    looped = {"strategy": "looped", "block_n": 2048, "num_warps": 8}
    split = {"strategy": "split", "block_n": 1024, "split": 16, "num_warps": 4}
    assert row_norm.mutate(reg, "registers") is None
    assert row_norm.mutate(looped, "registers") == {"strategy": "registers", "rows": 1, "num_warps": 8}
    assert row_norm.mutate(reg, "more_rows") == {**reg, "rows": 2}
    assert row_norm.mutate(looped, "more_rows") is None
    assert row_norm.mutate(reg, "more_warps") == {**reg, "num_warps": 8}
    assert row_norm.mutate({**reg, "num_warps": 16}, "more_warps") is None
    assert row_norm.mutate({**reg, "num_warps": 1}, "fewer_warps") is None
    assert row_norm.mutate(looped, "more_splits") == {
        "strategy": "split",
        "block_n": 2048,
        "split": 8,
        "num_warps": 8,
    }
    assert row_norm.mutate(split, "more_splits") == {**split, "split": 32}
    assert row_norm.mutate(split, "fewer_splits") == {**split, "split": 8}
    assert row_norm.mutate({**split, "split": 2}, "fewer_splits") == {
        "strategy": "looped",
        "block_n": 1024,
        "num_warps": 4,
    }
    assert row_norm.mutate(looped, "fewer_splits") is None
    assert row_norm.mutate(reg, "smaller_tiles")["strategy"] == "looped"
    assert row_norm.mutate(looped, "smaller_tiles") == {**looped, "block_n": 1024}
    assert row_norm.mutate(looped, "larger_tiles") == {**looped, "block_n": 4096}
    assert row_norm.mutate(reg, "larger_tiles") is None
    with pytest.raises(ValueError):
        row_norm.mutate(reg, "no_such_move")

    # KernelBench's LayerNorm: 16 rows of 64*256*256 elements: no row fits registers
    long_rows = {"n_cols": 64 * 256 * 256}
    assert [k["strategy"] for k in row_norm.ROUND0 if row_norm.feasible(long_rows, k)] == ["looped", "split"]
    # 8192 elements: 64 per thread at 4 warps fits, 8 such rows per program do not
    assert row_norm.feasible({"n_cols": 8192}, reg)
    assert not row_norm.feasible({"n_cols": 8193}, reg)  # 16384 at 4 warps: 128 per thread
    assert row_norm.feasible({"n_cols": 8193}, {**reg, "num_warps": 16})
    assert not row_norm.feasible({"n_cols": 1024}, {**reg, "rows": 16})
    assert not row_norm.feasible({"n_cols": 65536}, {**reg, "num_warps": 32})  # past MAX_BLOCK
    # the row length unknown (F.layer_norm's dims): its last dim bounds it from below
    assert not row_norm.feasible({"min_cols": 65536}, {**reg, "num_warps": 16})
    assert row_norm.feasible({"min_cols": 48}, reg)
    assert not row_norm.feasible({"n_cols": 4096}, {**split, "split": 1})


def test_kb_run_picks_a_layernorm_winner(tmp_path):
    state = run_inprocess(LAYERNORM, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert state.finished.winner
    assert {c.proposal.family for c in state.candidates.values()} == {"layernorm"}
    assert state.candidates[state.finished.winner].proposal.family == "layernorm"


# KernelBench's LayerNorm layout as users bring it, no kb extras: 16 rows of 64 * 256 * 256 elements
FULL_SIZE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)

batch_size = 16
features = 64
dim1 = 256
dim2 = 256

def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]

def get_init_inputs():
    return [(features, dim1, dim2)]
"""


def test_a_cpu_run_proposes_only_strategies_that_run_the_primary_shape(box):
    """On CPU the rungs time a fitted shape whose short rows fit registers; the analysis also traces the
    file's own shape on the meta device (normalized_shape recorded), and the generator drops what
    cannot run there."""
    reply = box.call(AnalyseRequest(problem_source=FULL_SIZE, device="cpu"), timeout_s=120)[0]
    analysis = ProblemAnalysed(**reply.model_dump(), families=[])
    timed = layernorm.matches(analysis.ops)
    primary = layernorm.matches(analysis.primary_ops)
    assert primary["n_cols"] == 64 * 256 * 256 and primary["norm_dims"] == 3
    assert timed["n_cols"] < primary["n_cols"], timed  # the fitted row fits registers
    assert any(k["strategy"] == "registers" and layernorm.feasible(timed, k) for k in row_norm.ROUND0)
    proposed = ExpertGenerator().first_round(analysis, problem_source=FULL_SIZE)
    assert {p.strategy for p in proposed} == {"looped", "split"}
