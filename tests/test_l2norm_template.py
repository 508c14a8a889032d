"""The l2norm template family: matched from the traced ops (x / torch.norm, F.normalize, the written-out
sum of squares), every round-0 candidate passes the gate (regular and irregular row lengths, the last
dim and an inner one, fp32 and fp16), and a whole run ends with an l2norm winner. The knobs and
mutations are row_norm's, tested with the layernorm family."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates import FAMILIES
from kernelbrain.templates.families import l2norm, row_norm
from tests.parts_check import assert_composed_of_parts, reachable_knobs
from tests.runs import QUICK_RUNGS, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "tests" / "problems"
L2NORM = PROBLEMS / "l2norm_small.py"
SMOKE = 'KB_SMOKE_SHAPE = {"batch_size": 5, "dim": 300}'
# problem_variants() and OTHER_PROBLEMS (other families' problems) feed conftest's problems/analyses fixtures
OTHER_PROBLEMS = {
    "softmax": ROOT / "benchmarks" / "problems" / "softmax.py",
    "rmsnorm": ROOT / "benchmarks" / "problems" / "rmsnorm.py",
    "layernorm": PROBLEMS / "layernorm_small.py",
    "layernorm_decomposed": PROBLEMS / "layernorm_decomposed.py",
}
# the sum of squares written out, over dim 1 of (N, C, S): rows along an inner dim
INNER = """
import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"n": 3, "c": 24, "s": 10}
n, c, s = 3, 24, 10


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x / torch.sqrt(torch.sum(x * x, dim=1, keepdim=True))


def get_inputs():
    return [torch.randn(n, c, s)]


def get_init_inputs():
    return []
"""
MULTI_TILE = [
    {"strategy": "looped", "block_n": 64, "num_warps": 2},
    {"strategy": "split", "block_n": 32, "split": 4, "num_warps": 2},
]


def problem_variants() -> dict[str, str]:
    seed = L2NORM.read_text()
    assert SMOKE in seed
    return {
        "seed": seed,  # 5 rows of 300
        "regular": seed.replace(SMOKE, 'KB_SMOKE_SHAPE = {"batch_size": 4, "dim": 256}'),
        "normalize_fp16": (PROBLEMS / "l2norm_normalize.py").read_text(),
        "inner": INNER,
    }


def test_matches_l2_normalisations_and_nothing_else(analyses):
    for name in problem_variants():
        assert [f.FAMILY for f in FAMILIES if f.matches(analyses[name]["ops"]) is not None] == ["l2norm"], (
            name
        )
    for name in OTHER_PROBLEMS:
        assert l2norm.matches(analyses[name]["ops"]) is None, name
    assert l2norm.matches(analyses["seed"]["ops"]) == {
        "dim": 1,
        "ndim": 2,
        "n_cols": 300,
        "dtype": "float32",
        "eps": 0.0,
    }
    fp16 = l2norm.matches(analyses["normalize_fp16"]["ops"])
    assert (fp16["dim"], fp16["n_cols"], fp16["dtype"], fp16["eps"]) == (2, 72, "float16", 1e-12)
    assert l2norm.matches(analyses["inner"]["ops"])["dim"] == 1


def _ops(*names: str, **extra) -> list[dict]:
    x = {"ndim": 2, "shape": [4, 64], "dtype": "float32"}
    return [{"op": n, **x, **extra.get(n, {})} for n in names]


@pytest.mark.parametrize(
    ("ops", "why"),
    [
        (_ops("norm", "div", norm={"dim": 1, "keepdim": True}), None),  # p absent: torch.norm's 2-norm
        (_ops("pow", "sum", "rsqrt", "mul", pow={"dim": 2}, sum={"dim": -1, "keepdim": True}), None),
        (_ops("norm", "div", norm={"dim": 1, "keepdim": True, "p": 1}), "an L1 norm"),
        (_ops("normalize", normalize={"dim": 1, "p": 1.0, "eps": 1e-12}), "an L1 normalize"),
        (_ops("norm", "div", norm={"dim": 1}), "no keepdim"),
        (_ops("norm", "div", norm={"dim": [0, 1], "keepdim": True}), "two dims"),
        (_ops("norm", norm={"dim": 1, "keepdim": True}), "the norm alone"),
        (_ops("pow", "sum", "sqrt", "div", pow={"dim": 3}, sum={"dim": 1, "keepdim": True}), "a cube"),
        (
            _ops("pow", "sum", "add", "sqrt", "div", pow={"dim": 2}, sum={"dim": 1, "keepdim": True}),
            "eps unknown",
        ),
        (_ops("pow", "mean", "sqrt", "div", pow={"dim": 2}, mean={"dim": 1, "keepdim": True}), "a mean: rms"),
    ],
)
def test_spellings_and_near_misses(ops, why):
    spec = l2norm.matches(ops)
    assert (spec is None) == (why is not None), why


# every round-0 knob set on every variant; the multi-tile ones on two irregular variants
CASES = [(v, k) for v in problem_variants() for k in row_norm.ROUND0] + [
    (v, k) for v in ("seed", "inner") for k in MULTI_TILE
]


@pytest.mark.parametrize(
    ("variant", "knobs"), CASES, ids=[f"{v}-" + "-".join(str(x) for x in k.values()) for v, k in CASES]
)
def test_round0_candidates_pass_the_gate(box, problems, analyses, variant, knobs):
    spec = l2norm.matches(analyses[variant]["ops"])
    assert l2norm.feasible(spec, knobs)
    source = l2norm.render(spec, knobs, analyses[variant]["signature"])
    args = {"problem_source": problems[variant], "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=120)[0].model_dump()
    assert r["passed"] is True, r


def test_every_reachable_knob_set_renders_from_the_parts_module():
    spec = {"dim": 1, "ndim": 2, "n_cols": 300, "dtype": "float32", "eps": 1e-12}
    knob_sets = reachable_knobs(row_norm)
    assert {k["strategy"] for k in knob_sets} == {"registers", "looped", "split"}
    for knobs in knob_sets:
        source = l2norm.render(spec, knobs, {"init": [], "forward": ["x"]})
        assert_composed_of_parts(source, row_norm.PARTS, knobs)
        assert f"_row_norm_{knobs['strategy']}_kernel" in source


def test_kb_run_picks_an_l2norm_winner(tmp_path):
    state = run_inprocess(L2NORM, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert state.finished.winner
    assert {c.proposal.family for c in state.candidates.values()} == {"l2norm"}
    assert state.candidates[state.finished.winner].proposal.family == "l2norm"
