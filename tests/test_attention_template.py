"""The attention template family: matched from the traced scaled_dot_product_attention (and nothing
else), every round-0 candidate passes the gate (the seed smoke shape, a ragged sequence with an odd head
dim, a head too wide for full_d that takes the D-tiled path, fp16, bf16; each with the gate's x8 seed),
one bf16 rounding of P fails that seed where the split P passes, every dot an fp32 input reaches asks
for fp32 accuracy (fp64, ieee or 3xTF32, never TF32), mutations move knobs, feasibility refuses tiles
that do not fit, and an in-process run on sdp_attn ends with an attention winner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbrain.core.diagnosis import LABELS
from kernelbrain.core.problem import read_problem
from kernelbrain.core.protocol import AnalyseRequest, GateRequest
from kernelbrain.templates.families import attention as at
from tests.parts_check import assert_composed_of_parts, reachable_knobs
from tests.runs import QUICK_RUNGS, interpreter_env, run_inprocess, run_interpreted

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


def _first(strategy: str) -> dict:
    return next(k for k in at.ROUND0 if k["strategy"] == strategy)


FULL, TILED, MAT = _first("full_d"), _first("d_tiled"), _first("materialized")


def _smoke(b: int, h: int, seq: int, d: int, dtype: str) -> str:
    return (
        f'KB_SMOKE_SHAPE = {{"batch_size": {b}, "num_heads": {h}, "sequence_length": {seq}, '
        f'"embedding_dimension": {d}, "dtype": torch.{dtype}}}'
    )


VARIANTS = {
    # the sequence a multiple of no block, the head dim of no power of two: every edge tile masked
    "irregular": _smoke(2, 1, 37, 40, "float32"),
    # padded head 512 > FULL_D_MAX: full_d is infeasible (and falls back at run time), d_tiled loops
    # over several ragged D chunks, materialized runs its three kernels (elsewhere it runs full_d)
    "wide_head": _smoke(1, 2, 23, 300, "float32"),
    "fp16": _smoke(1, 2, 48, 64, "float16"),
    # long enough rows that P rounded once to bf16 fails the x8 seed (see the p16 test)
    "bf16": _smoke(1, 2, 128, 128, "bfloat16"),
}


# other families' problems, which attention must not match (tests/conftest.py's `analyses` traces them)
OTHER_PROBLEMS = {"softmax": SOFTMAX, "rmsnorm": RMSNORM, "linear": LINEAR}


def problem_variants() -> dict[str, str]:
    """The seed problem and its smoke-shape variants (tests/conftest.py's `problems` reads them)."""
    source = SDPA.read_text()
    assert SMOKE in source
    return {"seed": source, **{k: source.replace(SMOKE, v) for k, v in VARIANTS.items()}}


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
    assert 'QK32 = "fp64"' in src and f'PV32 = "{at.ROUND0[0]["pv32"]}"' in src and 'P16 = "split"' in src
    with pytest.raises(ValueError):
        at.render(at.matches(ops), at.ROUND0[0], {"init": [], "forward": ["x"]})
    with pytest.raises(ValueError, match="qk32='tf32'"):
        at.render(at.matches(ops), {**at.ROUND0[0], "qk32": "tf32"}, analyses["seed"]["signature"])
    # a knob set recorded before the precision knobs existed renders with the defaults
    legacy = {k: v for k, v in TILED.items() if k not in at.PRECISION}
    assert 'QK32 = "fp64"' in at.render(at.matches(ops), legacy, analyses["seed"]["signature"])


def test_every_render_is_composed_from_the_parts_module():
    """Every round-0 knob set and every knob set one mutation away (each strategy, short16, presplit)
    renders a module that parses, whose functions (kernels and launchers) are the parts module's own, as
    written there, and that holds no placeholder."""
    sets = reachable_knobs(at)
    assert {k["strategy"] for k in sets} == set(at.STRATEGIES)
    assert {at.precision(k)["pv32"] for k in sets} == set(at.PV32) and any(k.get("short16") for k in sets)
    spec = {"bh": 2, "lq": 32, "d": 16, "dtype": "float32"}
    for knobs in sets:
        src = at.render(spec, knobs, {"init": [], "forward": ["Q", "K", "V"]})
        found = assert_composed_of_parts(src, at.PARTS, knobs)
        assert found.kernels == set(at.KERNEL_PARTS), knobs
        assert found.functions == {*at.KERNEL_PARTS, *at.HOST_PARTS}, knobs


@pytest.mark.parametrize("knobs", at.ROUND0, ids=lambda k: "-".join(str(v) for v in k.values()))
@pytest.mark.parametrize("variant", ["seed", *VARIANTS])
def test_round0_candidates_pass_the_gate(box, problems, analyses, variant, knobs):
    analysis = analyses[variant]
    spec = at.matches(analysis["ops"])
    # the wide head is beyond full_d: the generator would not propose it, yet its run-time fallback works
    assert at.feasible(spec, knobs) is (variant != "wide_head" or knobs["strategy"] != "full_d")
    source = at.render(spec, knobs, analysis["signature"])
    args = {"problem_source": problems[variant], "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=300)[0].model_dump()
    assert r["passed"] is True, r
    if variant not in {"fp16", "bf16"}:  # these pass at their own tolerance, 1e-2
        assert r["max_abs_err"] < 1e-3


def test_one_rounded_p_passes_bf16_within_the_references_own_error(box, problems, analyses):
    """P rounded once to bf16 before P V errs where weighted values cancel, as PyTorch's own bf16
    attention does: under the gate's rule (within 16x the bf16 reference's own error against float64
    truth) it passes every seed, the wide-range one included."""
    analysis = analyses["bf16"]
    single = {**TILED, "p16": "single"}
    source = at.render(at.matches(analysis["ops"]), single, analysis["signature"])
    args = {"problem_source": problems["bf16"], "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=300)[0].model_dump()
    assert r["passed"] is True, r
    assert r["tolerance"] == 1e-2


# Runs in a fresh interpreter: TRITON_INTERPRET must be set before triton.language is first imported
# (its own @jit helpers are decorated then). Records every tl.dot the interpreter executes.
DOT_SPY = """
import json, sys
import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter
from kernelbrain.child.loading import load_module
from kernelbrain.templates.families import attention as at

seen = []
real = interpreter.InterpreterBuilder.create_dot

def spy(self, a, b, d, input_precision, max_num_imprecise_acc):
    name = input_precision.name
    if name == "TF32" and str(a.dtype) == str(b.dtype) == "fp32":
        # operands already rounded to TF32 (low 13 mantissa bits zero): the tensor core takes them exactly
        bits = [np.ascontiguousarray(t.data, dtype=np.float32).view(np.uint32) for t in (a, b)]
        if all(((x & 0x1FFF) == 0).all() for x in bits):
            name = "TF32-exact"
    seen.append((str(a.dtype), str(b.dtype), name))
    return real(self, a, b, d, input_precision, max_num_imprecise_acc)

interpreter.InterpreterBuilder.create_dot = spy

@triton.jit
def plain(a_ptr, o_ptr):
    r = tl.arange(0, 16)
    a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
    tl.store(o_ptr + r[:, None] * 16 + r[None, :], tl.dot(a, a))

plain[(1,)](torch.randn(16, 16), torch.empty(16, 16))
out = {"plain": sorted(set(seen))}
sig = {"init": [], "forward": ["q", "k", "v"]}
for case in json.loads(sys.argv[1]):
    model = load_module(at.render(case["spec"], case["knobs"], sig), "cand").ModelNew()
    q, k, v = (torch.randn(case["shape"], dtype=getattr(torch, case["dtype"])) for _ in range(3))
    seen.clear()
    model(q, k, v)
    out[case["name"]] = sorted(set(seen))
print(json.dumps(out))
"""


def test_every_dot_on_fp32_inputs_asks_for_fp32_accuracy():
    """fp32 inputs: Q K^T in fp64 (or ieee/3xTF32 where the knob says so) and P V in ieee or 3xTF32 on
    every dot executed, every kernel; never TF32 on operands TF32 would round (the default a plain
    tl.dot gets: the control shows the interpreter records it). presplit's TF32 dots take operands
    already rounded to TF32 (hi and lo parts), which the spy checks bit by bit. 16-bit inputs stay on
    16-bit tensor-core dots."""
    spec16 = {"bh": 2, "lq": 32, "d": 16, "dtype": "float32"}
    cases = []
    for i, knobs in enumerate(at.ROUND0):
        for d in (16, 300):  # 300: too wide for full_d (which falls back to d_tiled): materialized's GEMMs
            cases.append({"name": f"r0-{i}-d{d}", "knobs": knobs, "spec": spec16, "shape": [1, 2, 20, d]})
    for qk in ("ieee", "tf32x3"):
        cases.append({"name": f"qk-{qk}", "knobs": {**TILED, "qk32": qk}, "spec": spec16})
        cases[-1]["shape"] = [1, 2, 20, 40]
    for c in cases:
        c["dtype"] = "float32"
    cases.append({"name": "fp16", "knobs": TILED, "spec": spec16, "shape": [1, 2, 20, 40]})
    cases[-1]["dtype"] = "float16"
    seen = run_interpreted(DOT_SPY, json.dumps(cases))
    f32, f64, f16 = "fp32", "fp64", "fp16"
    name = {"ieee": "IEEE", "tf32x3": "TF32x3", "presplit": "TF32x3"}  # the interpreter's names
    assert seen["plain"] == [[f32, f32, "TF32"]]
    for case in cases[:-1]:  # every fp32 case: no dot may fall back to TF32
        assert all(prec != "TF32" for _, _, prec in seen[case["name"]]), (case, seen[case["name"]])
    for i, knobs in enumerate(at.ROUND0):
        for d in (16, 300):
            # Q K^T on widened fp64 tiles, P V in the knob's precision: nothing else. presplit runs in
            # materialized's GEMM only (at d = 300); in the one-pass kernels it is tf32x3
            pv = name[knobs["pv32"]]
            if knobs["pv32"] == "presplit" and d == 300:
                pv = "TF32-exact"
            assert seen[f"r0-{i}-d{d}"] == sorted([[f64, f64, "IEEE"], [f32, f32, pv]]), (knobs, d)
    assert any(k["pv32"] == "presplit" and k["strategy"] == "materialized" for k in at.ROUND0)
    assert TILED["pv32"] == "ieee"
    assert seen["qk-ieee"] == [[f32, f32, "IEEE"]]
    assert seen["qk-tf32x3"] == sorted([[f32, f32, "IEEE"], [f32, f32, "TF32x3"]])
    assert seen["fp16"] == [[f16, f16, "TF32"]]  # P split into two fp16 dots; precision is moot at 16 bits


def test_mutations_move_knobs_and_feasibility_refuses_what_does_not_fit():
    assert set(at.MUTATIONS) == set(LABELS)
    for knobs in at.ROUND0:
        for moves in at.MUTATIONS.values():
            for move, why in moves:
                child = at.mutate(knobs, move)
                assert why and (child is None or child != knobs), (knobs, move)
    full, tiled = FULL, TILED
    assert at.mutate(full, "full_d") is None
    assert at.mutate(tiled, "full_d") == {
        k: v for k, v in tiled.items() if k not in {"block_d", "block_dv"}
    } | {"strategy": "full_d"}
    assert at.mutate(tiled, "wider_dv") == {**tiled, "block_dv": 256}
    assert at.mutate(tiled, "narrower_dv") == {**tiled, "block_dv": 64}
    assert at.mutate(full, "narrower_dv")["strategy"] == "d_tiled"
    assert at.mutate(full, "wider_dv") is None
    assert at.mutate(tiled, "longer_d") == {**tiled, "block_d": 64}
    # the P V precision moves between its two accurate values; legacy knob sets default to ieee
    assert tiled["pv32"] == "ieee" and at.mutate(tiled, "ieee_pv") is None
    assert at.mutate(tiled, "tf32x3_pv") == {**tiled, "pv32": "tf32x3"}
    assert at.mutate(full, "ieee_pv") == {**full, "pv32": "ieee"}
    legacy = {k: v for k, v in tiled.items() if k not in at.PRECISION}
    assert at.precision(legacy) == {"qk32": "fp64", "pv32": "ieee", "p16": "split"}
    assert at.mutate(legacy, "tf32x3_pv") == {**legacy, "pv32": "tf32x3"}
    assert {k["pv32"] for k in at.ROUND0} == set(at.PV32)  # round 0 spreads both
    assert {k["qk32"] for k in at.ROUND0} == {"fp64"} and {k["p16"] for k in at.ROUND0} == {"split"}
    assert at.mutate(full, "larger_m") == {**full, "block_m": 128}
    assert at.mutate({**full, "block_m": 16}, "smaller_m") is None
    assert at.mutate({**full, "block_n": 16}, "smaller_n") is None
    assert at.mutate(full, "more_stages") == {**full, "num_stages": 3}
    assert at.mutate({**full, "num_warps": 16}, "more_warps") is None
    with pytest.raises(ValueError):
        at.mutate(full, "no_such_move")

    # materialize: from either other strategy, keeping the tiles it shares; never from itself
    assert at.mutate(tiled, "materialize") == {**tiled, "strategy": "materialized"}
    assert at.mutate(full, "materialize") == {
        **full,
        "strategy": "materialized",
        "block_d": 16,
        "block_dv": 128,
    }
    assert at.mutate(MAT, "materialize") is None
    assert at.mutate(MAT, "full_d")["strategy"] == "full_d"
    assert at.mutate(MAT, "wider_dv") == {**MAT, "block_dv": 256}
    ieee_mat = next(k for k in at.ROUND0 if k["strategy"] == "materialized" and k["pv32"] == "ieee")
    assert at.mutate(ieee_mat, "presplit_pv") == {**ieee_mat, "pv32": "presplit"}
    assert at.mutate(full, "presplit_pv") is None and at.mutate(tiled, "presplit_pv") is None

    # the ladder's shapes: D = 1024 (fp32, fp16) d_tiled and materialized; D = 128 (bf16) all (there
    # materialized runs full_d, and full_d's limits decide)
    d1024 = {"bh": 1024, "lq": 512, "d": 1024, "dtype": "float32"}
    d128 = {"bh": 128, "lq": 4096, "d": 128, "dtype": "bfloat16"}
    for knobs in at.ROUND0:
        assert at.feasible(d1024, knobs) is (knobs["strategy"] != "full_d"), knobs
        assert at.feasible(d128, knobs), knobs
    assert at.feasible(d128, {**MAT, "narrow16_m": 256, "narrow16_warps": 1}) is False  # full_d's acc spills
    fp32_tiles = {k: v for k, v in MAT.items() if k not in at.TILE16_KNOBS}
    assert at.feasible(d128, {**fp32_tiles, "block_m": 256, "num_warps": 1}) is False  # the same, fp32 knobs
    assert not at.feasible(d1024, {**MAT, "strategy": "no_such"})
    # fp64 score tiles of 128 x 128 on 128 threads: 256 registers a thread for the accumulator alone
    assert not at.feasible(d1024, {**MAT, "block_m": 128, "block_n": 128, "num_warps": 4})
    assert not at.feasible(d128, {**full, "block_m": 256, "num_warps": 1})  # acc spills
    assert not at.feasible(d128, {**full, "block_n": 24})  # not a power of two
    assert not at.feasible(d128, {**full, "block_n": 8})  # tl.dot needs >= 16
    assert not at.feasible(d1024, {**tiled, "block_dv": 1024, "num_warps": 4})  # 64x1024 acc on 128 threads
    assert not at.feasible(d128, {**full, "num_stages": 0})
    assert not at.feasible(d128, {**full, "qk32": "tf32"})  # not a precision value
    # fp64 scores and widened Q/K chunks take twice the registers (ptxas: 1.7 KB of spills on sm90)
    wide_chunks = {**tiled, "block_d": 64, "num_warps": 4}
    assert not at.feasible(d1024, wide_chunks) and at.feasible(d1024, {**wide_chunks, "qk32": "ieee"})
    # full_d's fp64-widened Q block is staged in shared memory: fits at D = 64, not at D = 128
    d128_fp32 = {**d128, "dtype": "float32"}
    big = [k for k in at.ROUND0 if k["strategy"] == "full_d"][1]
    assert at.feasible({**d128_fp32, "d": 64}, big) and not at.feasible(d128_fp32, big)


def test_in_process_run_on_sdp_attn_picks_an_attention_winner(tmp_path):
    state = run_inprocess(SDPA, tmp_path / "kb.db", max_candidates=3, rungs=QUICK_RUNGS)
    assert state.finished.winner
    assert {c.proposal.family for c in state.candidates.values()} == {"attention"}
    assert state.candidates[state.finished.winner].proposal.family == "attention"


def test_attn_check_tool_runs_end_to_end_on_cpu(tmp_path):
    """tools/attn_check.py (the H200 check) on the smoke shape through the interpreter: every round-0
    render passes at the problem's tolerance, and at the x8 seed fp32-accumulated scores (the ieee
    control) err far more than the fp64 scores the round-0 renders use."""
    out = tmp_path / "attn.json"
    cmd = [sys.executable, str(ROOT / "tools" / "attn_check.py"), "--device", "cpu", "--reps", "1"]
    proc = subprocess.run(
        [*cmd, "--out", str(out)], env=interpreter_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {r["variant"]: r for r in report["rows"]}
    assert report["spec"] == {"bh": 2, "lq": 32, "d": 16, "dtype": "float32"}
    round0 = [r for r in report["rows"] if r["role"] == "round0"]
    assert len(round0) == sum(at.feasible(report["spec"], k) for k in at.ROUND0) > 0
    for r in round0:
        assert r["passed"] is True and r["tolerance"] == 1e-4 and len(r["seeds"]) == 3, r
        assert r["median_s"] > 0 and r["eager_median_s"] > 0
    assert rows["eager"]["passed"] is True
    assert "ctl-p-single" not in rows  # a 16-bit control: not run at an fp32 shape
    worst = max(r["seeds"][2]["max_abs_err"] for r in round0)
    assert rows["ctl-qk-ieee"]["seeds"][2]["max_abs_err"] > 10 * worst
    assert "r0-0" in proc.stdout and "max abs err per seed" in proc.stdout  # the table


# 16-bit tiles of their own (narrow ones: several programs and key steps at the smoke shapes)
OWN16 = {
    "wide16_m": 16,
    "wide16_n": 32,
    "wide16_d": 64,
    "wide16_k": 16,
    "wide16_warps": 2,
    "wide16_stages": 1,
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_materialized_chunks_over_bh_and_serves_16_bit_wide_heads(box, tmp_path, dtype):
    """A wide head (D = 300) runs materialized's three kernels; with the scratch budget cut to one bh
    the batch-heads go through in chunks (two of one here), and at 16 bits the softmax writes P as hi
    and lo planes in V's dtype for the P V GEMM's two dots (or, short16, one kernel holds whole score
    rows: Lk = 23 fits). Each materialized round-0 set, and one with 16-bit tiles of its own plain and
    with short16, passes the gate (x8 seed included) both ways."""
    path = tmp_path / f"wide_{dtype}.py"
    path.write_text(SDPA.read_text().replace(SMOKE, _smoke(1, 2, 23, 300, dtype)))
    source = read_problem(path)
    analysis = box.call(AnalyseRequest(problem_source=source, device="cpu"), timeout_s=120)[0].model_dump()
    spec = at.matches(analysis["ops"])
    mats = [k for k in at.ROUND0 if k["strategy"] == "materialized"]
    own = {**mats[0], **OWN16}
    for knobs in [*mats, own, {**own, "short16": True}]:
        assert at.feasible(spec, knobs)
        whole = at.render(spec, knobs, analysis["signature"])
        chunked = whole.replace(f"SCRATCH_BYTES = {at.SCRATCH_BYTES}", "SCRATCH_BYTES = 1")
        assert chunked != whole
        for cand in (whole, chunked):
            args = {"problem_source": source, "cand_source": cand, "device": "cpu", "seeds": 3}
            r = box.call(GateRequest(**args), timeout_s=300)[0].model_dump()
            assert r["passed"] is True, (knobs, r)


def test_16_bit_inputs_take_their_own_tiles_where_set():
    """tiles(): fp32 inputs always take the fp32 knobs; 16-bit ones their head group's knobs (wide16_*
    past FULL_D_MAX, narrow16_* up to it) where set, each falling back to its fp32 knob; the render
    carries every tile set; feasible() refuses 16-bit tiles that are no tiles (not a power of two) or
    that overflow registers or shared memory at the traced wide head."""
    base = {k: v for k, v in at.ROUND0[0].items() if k not in at.TILE16_KNOBS and k != "short16"}
    assert at.tiles(base, "float16", 1024) == at.tiles(base, "float32", 1024)
    own = {**base, "wide16_d": 64, "wide16_warps": 4, "narrow16_m": 32}
    t32 = at.tiles(own, "float32", 1024)
    assert (
        t32 == at.tiles(base, "float32", 1024) and t32["d"] == base["block_d"] and t32["m"] == base["block_m"]
    )
    assert at.tiles(own, "bfloat16", 1024) == {**t32, "d": 64, "warps": 4}
    assert at.tiles(own, "float16", 128) == {**t32, "m": 32}
    spec = {"bh": 1024, "lq": 512, "d": 1024, "dtype": "float32"}
    src = at.render(spec, own, {"init": [], "forward": ["Q", "K", "V"]})
    assert f"'wide16': {at.tiles(own, 'float16', 1024)!r}" in src
    assert f"'narrow16': {at.tiles(own, 'float16', 128)!r}" in src and "SHORT16 = False" in src
    assert "SHORT16 = True" in at.render(
        spec, {**own, "short16": True}, {"init": [], "forward": ["Q", "K", "V"]}
    )
    assert at.feasible(spec, {**base, **OWN16}) and at.feasible(spec, at.ROUND0[0])
    assert not at.feasible(spec, {**base, "wide16_d": 48})
    assert not at.feasible(spec, {**base, "wide16_warps": 3})
    assert not at.feasible(spec, {**base, "narrow16_n": 48})
    # 256 x 256 score tiles stepping 128 of the head, 3 stages: 256 scores a thread, 384 KiB of operands
    assert not at.feasible(spec, {**base, "wide16_m": 256, "wide16_n": 256, "wide16_d": 128})
    assert at.feasible(spec, {**base, "wide16_m": 128, "wide16_n": 128, "wide16_d": 64})
    # short16 at 64 rows on 8 warps: 64 x (256 scores + 128 outputs) in 256 threads; 128 rows do not fit
    short = {**base, "short16": True, "wide16_m": 64, "wide16_warps": 8}
    assert at.feasible(spec, short) and not at.feasible(spec, {**short, "wide16_m": 128})
    # and its staged Q/K chunks and P fit shared memory: these three passed the register rule, and
    # Triton refused them on the H200 (needing 278528, 327680 and 294912 bytes of 232448; probe5)
    # (round 0's first set at 64 rows on 8 warps, then each change experiments/attn_host.py was given)
    probed = {**at.ROUND0[0], "wide16_m": 64, "wide16_warps": 8}
    for over in ({"wide16_stages": 3}, {"wide16_d": 256}, {"wide16_m": 128, "wide16_warps": 16}):
        assert not at.feasible(spec, {**probed, **over}), over
    for ran in (probed, {**probed, "wide16_d": 64}, {**probed, "wide16_m": 32}, at.ROUND0[0]):
        assert at.feasible(spec, ran), ran
