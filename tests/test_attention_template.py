"""The attention template family: matched from the traced scaled_dot_product_attention (and nothing
else), every round-0 candidate passes the gate (the seed smoke shape, a ragged sequence with an odd head
dim, a head too wide for full_d that takes the D-tiled path, fp16), mutations move knobs, feasibility
refuses tiles that do not fit, and an in-process run on sdp_attn ends with an attention winner."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbrain.diagnosis import LABELS
from kernelbrain.problem import read_problem
from kernelbrain.sandbox import Sandbox
from kernelbrain.templates import attention as at
from tests.runs import run_inprocess

ROOT = Path(__file__).resolve().parents[1]
SDPA = ROOT / "benchmarks" / "problems" / "sdp_attn.py"
SOFTMAX = ROOT / "benchmarks" / "problems" / "softmax.py"
RMSNORM = ROOT / "benchmarks" / "problems" / "rmsnorm.py"
LINEAR = ROOT / "benchmarks" / "problems" / "linear_relu_div.py"
SMOKE = """KB_SMOKE_SHAPE = {
    "batch_size": 1,
    "num_heads": 2,
    "sequence_length": 32,
    "embedding_dimension": 16,
    "dtype": torch.float32,
}"""


def _smoke(b: int, h: int, seq: int, d: int, dtype: str) -> str:
    return (
        f'KB_SMOKE_SHAPE = {{"batch_size": {b}, "num_heads": {h}, "sequence_length": {seq}, '
        f'"embedding_dimension": {d}, "dtype": torch.{dtype}}}'
    )


VARIANTS = {
    # the sequence a multiple of no block, the head dim of no power of two: every edge tile masked
    "irregular": _smoke(2, 1, 37, 40, "float32"),
    # padded head 512 > FULL_D_MAX: full_d is infeasible (and falls back at run time), d_tiled loops
    # over several ragged D chunks
    "wide_head": _smoke(1, 2, 23, 300, "float32"),
    "fp16": _smoke(1, 2, 48, 64, "float16"),
}


@pytest.fixture(scope="module")
def problems(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("attention_problems")
    source = SDPA.read_text()
    assert SMOKE in source
    variants = {"seed": source, **{k: source.replace(SMOKE, v) for k, v in VARIANTS.items()}}
    out = {}
    for name, text in variants.items():
        (tmp / f"{name}.py").write_text(text)
        out[name] = read_problem(tmp / f"{name}.py")
    return out


@pytest.fixture(scope="module")
def analyses(box: Sandbox, problems: dict[str, str]) -> dict[str, dict]:
    sources = {
        **problems,
        "softmax": SOFTMAX.read_text(),
        "rmsnorm": RMSNORM.read_text(),
        "linear": LINEAR.read_text(),
    }
    return {
        name: box.call("analyse", {"problem_source": src, "device": "cpu"}, timeout_s=120)[0]
        for name, src in sources.items()
    }


def test_matches_sdpa_and_nothing_else(analyses):
    ops = analyses["seed"]["ops"]
    assert [o["op"] for o in ops] == ["scaled_dot_product_attention"]
    assert at.matches(ops) == {"bh": 2, "lq": 32, "d": 16, "dtype": "float32"}
    assert at.matches(analyses["irregular"]["ops"]) == {"bh": 2, "lq": 37, "d": 40, "dtype": "float32"}
    assert at.matches(analyses["fp16"]["ops"])["dtype"] == "float16"
    for other in ("softmax", "rmsnorm", "linear"):
        assert at.matches(analyses[other]["ops"]) is None, other
    (sdpa,) = ops
    assert at.matches([]) is None
    assert at.matches([{**sdpa, "dtype": "int64"}]) is None
    assert at.matches([sdpa, {**sdpa, "op": "relu"}]) is None  # something after it: not plain SDPA
    assert at.matches([{"op": "contiguous"}, sdpa]) is not None
    src = at.render(at.matches(ops), at.ROUND0[0], analyses["seed"]["signature"])
    assert "def forward(self, Q, K, V):" in src and "def __init__(self):" in src
    assert "scaled_dot_product_attention" not in src and "softmax(" not in src
    assert 'input_precision="ieee"' in src
    with pytest.raises(ValueError):
        at.render(at.matches(ops), at.ROUND0[0], {"init": [], "forward": ["x"]})


@pytest.mark.parametrize("knobs", at.ROUND0, ids=lambda k: "-".join(str(v) for v in k.values()))
@pytest.mark.parametrize("variant", ["seed", *VARIANTS])
def test_round0_candidates_pass_the_gate(box, problems, analyses, variant, knobs):
    analysis = analyses[variant]
    spec = at.matches(analysis["ops"])
    # the wide head is beyond full_d: the generator would not propose it, yet its run-time fallback works
    assert at.feasible(spec, knobs) is (variant != "wide_head" or knobs["strategy"] == "d_tiled")
    source = at.render(spec, knobs, analysis["signature"])
    args = {"problem_source": problems[variant], "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call("gate", args, timeout_s=300)[0]
    assert r["passed"] is True, r
    if variant not in {"fp16"}:  # these pass at their own tolerance, 1e-2
        assert r["max_abs_err"] < 1e-3


def test_mutations_move_knobs_and_feasibility_refuses_what_does_not_fit():
    assert set(at.MUTATIONS) == set(LABELS)
    for knobs in at.ROUND0:
        for moves in at.MUTATIONS.values():
            for move, why in moves:
                child = at.mutate(knobs, move)
                assert why and (child is None or child != knobs), (knobs, move)
    full, tiled = at.ROUND0[0], at.ROUND0[2]
    assert full["strategy"] == "full_d" and tiled["strategy"] == "d_tiled"
    assert at.mutate(full, "full_d") is None
    assert at.mutate(tiled, "full_d") == {
        k: v for k, v in tiled.items() if k not in {"block_d", "block_dv"}
    } | {"strategy": "full_d"}
    assert at.mutate(tiled, "wider_dv") == {**tiled, "block_dv": 256}
    assert at.mutate(tiled, "narrower_dv") == {**tiled, "block_dv": 64}
    assert at.mutate(full, "narrower_dv")["strategy"] == "d_tiled"
    assert at.mutate(full, "wider_dv") is None
    assert at.mutate(tiled, "longer_d") == {**tiled, "block_d": 128}
    assert at.mutate(full, "larger_m") == {**full, "block_m": 128}
    assert at.mutate({**full, "block_m": 16}, "smaller_m") is None
    assert at.mutate({**full, "block_n": 16}, "smaller_n") is None
    assert at.mutate(full, "more_stages") == {**full, "num_stages": 3}
    assert at.mutate({**full, "num_warps": 16}, "more_warps") is None
    with pytest.raises(ValueError):
        at.mutate(full, "no_such_move")

    # the ladder's shapes: D = 1024 (fp32, fp16) only d_tiled; D = 128 (bf16) both
    d1024 = {"bh": 1024, "lq": 512, "d": 1024, "dtype": "float32"}
    d128 = {"bh": 128, "lq": 4096, "d": 128, "dtype": "bfloat16"}
    for knobs in at.ROUND0:
        assert at.feasible(d1024, knobs) is (knobs["strategy"] == "d_tiled"), knobs
        assert at.feasible(d128, knobs), knobs
    assert not at.feasible(d128, {**full, "block_m": 256, "num_warps": 1})  # acc spills
    assert not at.feasible(d128, {**full, "block_n": 24})  # not a power of two
    assert not at.feasible(d128, {**full, "block_n": 8})  # tl.dot needs >= 16
    assert not at.feasible(d1024, {**tiled, "block_dv": 1024, "num_warps": 4})  # 64x1024 acc on 128 threads
    assert not at.feasible(d128, {**full, "num_stages": 0})


def test_in_process_run_on_sdp_attn_picks_an_attention_winner(tmp_path):
    state = run_inprocess(SDPA, tmp_path / "kb.db", max_candidates=3)
    assert state.finished.winner
    assert {c.proposal.family for c in state.candidates.values()} == {"attention"}
    assert state.candidates[state.finished.winner].proposal.family == "attention"
