"""The rmsnorm template family: matched from the traced ops, every round-0 candidate passes the gate
(regular and irregular shapes, an inner and a last reduced dim, fp32 and fp16), mutations move knobs,
feasibility refuses oversize register tiles, and a whole `kb run` on the seed problem ends with an
rmsnorm winner."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kernelbrain.core.diagnosis import LABELS
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates import FAMILIES
from kernelbrain.templates.families import rmsnorm
from tests.kbcli import kb
from tests.parts_check import assert_composed_of_parts, reachable_knobs

ROOT = Path(__file__).resolve().parents[1]
RMSNORM = ROOT / "benchmarks" / "problems" / "rmsnorm.py"
SMOKE = 'KB_SMOKE_SHAPE = {"batch_size": 2, "features": 64, "dim1": 8, "dim2": 16}'
# C = 20 is not a power of two; H*W = 63 is not a multiple of any BLOCK_S
IRREGULAR = 'KB_SMOKE_SHAPE = {"batch_size": 3, "features": 20, "dim1": 7, "dim2": 9}'
# the other common spelling: reduce over the last dim (S = 1), rsqrt then multiply, fp16 in and out
LAST_DIM_FP16 = """
import torch
import torch.nn as nn

batch_size, seq, hidden = 3, 5, 40
KB_SMOKE_SHAPE = {"batch_size": 3, "seq": 5, "hidden": 40}


class Model(nn.Module):
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def get_inputs():
    return [torch.rand(batch_size, seq, hidden, dtype=torch.float16)]


def get_init_inputs():
    return [hidden]
"""

# problem_variants() and OTHER_PROBLEMS (other families' problems) feed conftest's problems/analyses fixtures
OTHER_PROBLEMS = {"softmax": ROOT / "benchmarks" / "problems" / "softmax.py"}


def problem_variants() -> dict[str, str]:
    source = RMSNORM.read_text()
    assert SMOKE in source
    return {"seed": source, "irregular": source.replace(SMOKE, IRREGULAR), "last_dim_fp16": LAST_DIM_FP16}


def test_matches_the_traced_rmsnorm_and_nothing_else(analyses):
    ops = analyses["seed"]["ops"]
    assert [o["op"] for o in ops] == ["pow", "mean", "add", "sqrt", "div"]
    assert [f.FAMILY for f in FAMILIES if f.matches(ops) is not None] == ["rmsnorm"]
    spec = rmsnorm.matches(ops)
    assert spec["dim"] == 1 and spec["n_channels"] == 64 and spec["inner"] == 8 * 16 and spec["outer"] == 2
    assert rmsnorm.matches(analyses["softmax"]["ops"]) is None
    assert rmsnorm.matches(analyses["irregular"]["ops"])["n_channels"] == 20
    last = rmsnorm.matches(analyses["last_dim_fp16"]["ops"])
    assert (last["dim"], last["inner"], last["dtype"]) == (2, 1, "float16")


def _ops(*names: str, **extra) -> list[dict]:
    x = {"ndim": 4, "shape": [2, 64, 8, 16], "dtype": "float32"}
    return [{"op": n, **x, **extra.get(n, {})} for n in names]


@pytest.mark.parametrize(
    ("ops", "why"),
    [
        (_ops("mean", "sub", "pow", "add", "sqrt", "div", mean={"dim": 1, "keepdim": True}), "layer norm"),
        (
            _ops("pow", "mean", "add", "sqrt", "div", pow={"dim": 3}, mean={"dim": 1, "keepdim": True}),
            "a cube",
        ),
        (_ops("pow", "mean", "add", "sqrt", "div", pow={"dim": 2}, mean={"dim": 1}), "no keepdim"),
        (_ops("pow", "mean", "add", "sqrt", pow={"dim": 2}, mean={"dim": 1, "keepdim": True}), "no divide"),
        (_ops("pow", "mean", "add", "rsqrt", pow={"dim": 2}, mean={"dim": 1, "keepdim": True}), "rsqrt only"),
        (
            _ops("pow", "mean", "add", "sqrt", "div", pow={"dim": 2}, mean={"dim": (1, 2), "keepdim": True}),
            "2 dims",
        ),
        (
            _ops("pow", "sum", "add", "sqrt", "div", pow={"dim": 2}, sum={"dim": 1, "keepdim": True}),
            "no mean",
        ),
    ],
)
def test_near_misses_do_not_match(ops, why):
    assert rmsnorm.matches(ops) is None, why


def test_eps_comes_from_the_trace_when_recorded_else_from_the_constructor(analyses):
    traced = _ops("pow", "mean", "add", "sqrt", "div", pow={"dim": 2}, mean={"dim": 1, "keepdim": True})
    traced[2]["eps"] = 1e-3
    assert rmsnorm.matches(traced)["eps"] == 1e-3
    spec = rmsnorm.matches(analyses["seed"]["ops"])
    src = rmsnorm.render(spec, rmsnorm.ROUND0[0], {"init": ["num_features", "eps"], "forward": ["x"]})
    assert "def __init__(self, num_features, eps=EPS):" in src and "self.eps = float(eps)" in src
    src = rmsnorm.render(spec, rmsnorm.ROUND0[0], {"init": ["eps", "num_features"], "forward": ["x"]})
    assert "def __init__(self, eps=EPS, num_features=None):" in src
    src = rmsnorm.render(spec, rmsnorm.ROUND0[0], {"init": [], "forward": ["x"]})
    assert "def __init__(self):" in src and "self.eps = float(EPS)" in src
    assert re.search(r"^import (?!torch|triton)", src, re.M) is None  # standalone: torch and triton only


@pytest.mark.parametrize("knobs", rmsnorm.ROUND0, ids=lambda k: "-".join(str(v) for v in k.values()))
@pytest.mark.parametrize("variant", ["seed", "irregular", "last_dim_fp16"])
def test_round0_candidates_pass_the_gate(box, problems, analyses, variant, knobs):
    analysis = analyses[variant]
    spec = rmsnorm.matches(analysis["ops"])
    assert rmsnorm.feasible(spec, knobs)
    source = rmsnorm.render(spec, knobs, analysis["signature"])
    args = {"problem_source": problems[variant], "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=120)[0].model_dump()
    assert r["passed"] is True, r


def test_every_reachable_knob_set_renders_from_the_parts_module():
    spec = {"dim": 1, "ndim": 4, "outer": 2, "n_channels": 64, "inner": 128, "dtype": "float32", "eps": 1e-5}
    knob_sets = reachable_knobs(rmsnorm)
    assert {k["strategy"] for k in knob_sets} == {"registers", "looped"}
    for knobs in knob_sets:
        source = rmsnorm.render(spec, knobs, {"init": ["num_features", "eps"], "forward": ["x"]})
        assert_composed_of_parts(source, rmsnorm.PARTS, knobs)
        assert f"_rmsnorm_{knobs['strategy']}_kernel" in source


def test_mutations_move_knobs_and_feasibility_refuses_oversize_tiles():
    assert set(rmsnorm.MUTATIONS) == set(LABELS)
    for knobs in rmsnorm.ROUND0:
        for moves in rmsnorm.MUTATIONS.values():
            for move, why in moves:
                child = rmsnorm.mutate(knobs, move)
                assert why and (child is None or child != knobs), (knobs, move)
    reg = {"strategy": "registers", "block_s": 128, "num_warps": 4}
    looped = {"strategy": "looped", "block_c": 16, "block_s": 256, "num_warps": 8}
    assert rmsnorm.mutate(reg, "more_warps") == {**reg, "num_warps": 8}
    assert rmsnorm.mutate({**reg, "num_warps": 16}, "more_warps") is None
    assert rmsnorm.mutate({**reg, "num_warps": 1}, "fewer_warps") is None
    assert rmsnorm.mutate(reg, "wider_tiles") == {**reg, "block_s": 256}
    assert rmsnorm.mutate(reg, "narrower_tiles") == {**reg, "block_s": 64}
    assert rmsnorm.mutate(reg, "registers") is None
    assert rmsnorm.mutate(looped, "registers") == {"strategy": "registers", "block_s": 256, "num_warps": 8}
    assert rmsnorm.mutate(reg, "smaller_chunks")["strategy"] == "looped"
    assert rmsnorm.mutate(looped, "smaller_chunks") == {**looped, "block_c": 8}
    with pytest.raises(ValueError):
        rmsnorm.mutate(reg, "no_such_move")

    spec = {"dim": 1, "n_channels": 64, "inner": 512 * 512, "outer": 112}
    assert rmsnorm.feasible(spec, {**reg, "block_s": 512})  # 64 * 512 = 32768: fits
    assert not rmsnorm.feasible({**spec, "n_channels": 65}, {**reg, "block_s": 512})  # 128 * 512
    wide = {**spec, "n_channels": 65536}
    assert not any(rmsnorm.feasible(wide, k) for k in rmsnorm.ROUND0 if k["strategy"] == "registers")
    assert all(rmsnorm.feasible(wide, k) for k in rmsnorm.ROUND0 if k["strategy"] == "looped")
    # a tile is never wider than the spatial extent: at S = 1 only the channels count
    assert rmsnorm.feasible({**wide, "n_channels": 32768, "inner": 1}, {**reg, "block_s": 256})


def test_kb_run_on_the_seed_problem_picks_an_rmsnorm_winner(tmp_path):
    db = tmp_path / "kb.db"
    quick = "smallest:2:0,primary:2:0,all:2:0"  # tests/runs.py's QUICK_RUNGS: every rung's checks run
    args = ("--inprocess", "--max-candidates", "4", "--device", "cpu", "--ladder", quick, "--db", str(db))
    r = kb("run", str(RMSNORM), *args, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run_id = r.stdout.split()[1]
    status = json.loads(kb("status", run_id, "--db", str(db), "--json").stdout)
    assert status["state"] == "finished" and status["winner"]

    from kernelbrain.store import EventStore

    from kernelbrain.core.state import RunState

    with EventStore(db, create=False) as store:
        state = store.fold(RunState(run_id), run_id=run_id)
    assert {c.proposal.family for c in state.candidates.values()} == {"rmsnorm"}
    assert state.candidates[state.finished.winner].proposal.family == "rmsnorm"
