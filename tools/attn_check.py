"""Accuracy and speed of every attention-template render on the SDPA seed problem, outside a kb run.

For each round-0 knob set the expert generator would propose (plus controls that show why the
defaults are what they are), at the shapes the GPU gate checks (evaluate's gate_shapes: the problem's
KB_GATE_SHAPES) and then at its benchmark shapes (KB_SHAPES), over the gate's seeds, it reports the
max abs error against the float64 reference, the elements outside the problem's tolerance and
pass/fail, then the median time of the render and of eager PyTorch (CUDA events, L2 flushed: the
benchmarker's timer). Eager's own error is a row too.

Inputs: at the gate shapes, exactly the gate's (evaluate's draw and seed variants). At the benchmark
shapes the seed variants are drawn on the device by the same recipe (--draw device, the default): the
gate's host-side draw of a 537M-element shape takes minutes per seed; --draw gate uses it anyway.

    . tools/device_env.sh && python3 tools/attn_check.py --out $OUT/attn.json     # on the GPU machine
    TRITON_INTERPRET=1 .venv/bin/python tools/attn_check.py --device cpu --out /tmp/attn.json

On CPU (the Triton interpreter) it checks the problem's smoke shape only, and cannot show TF32
effects: the interpreter computes every dot in numpy.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; appended, so an installed kb (tools/device_env.sh) comes first
    sys.path.append(str(ROOT))

import torch  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from kernelbrain.child import draws, loading, timing  # noqa: E402
from kernelbrain.core.problem import shape_label  # noqa: E402
from kernelbrain.templates import knobs_with  # noqa: E402
from kernelbrain.templates.families import attention as at  # noqa: E402
from tools.gpu_setup import Log, compare, device_name, device_ok, sync, trace  # noqa: E402

DEFAULT_PROBLEM = ROOT / "benchmarks" / "problems" / "sdp_attn.py"


class SeedResult(BaseModel):
    seed: int
    max_abs_err: float
    bad: int
    numel: int
    passed: bool


class Row(BaseModel):
    shape: str
    dtype: str
    shape_kind: str  # "gate" (what the GPU gate checks), "ladder" (KB_SHAPES) or "cpu"
    draw: str  # "gate" (the gate's inputs) or "device" (its recipe, drawn on the device)
    variant: str
    role: str  # "round0", "extra" (--extra), "control" (expected to fail where noted) or "eager"
    expect: str
    knobs: dict[str, Any]
    tolerance: float
    seeds: list[SeedResult] = []
    passed: bool | None = None
    median_s: float | None = None
    eager_median_s: float | None = None
    speedup: float | None = None
    error: str | None = None


class Report(BaseModel):
    problem: str
    device: str
    gpu: str
    torch: str
    triton: str
    spec: dict[str, Any]
    seeds: int
    reps: int
    wall_s: float = 0.0
    rows: list[Row] = []


class Variant(BaseModel):
    name: str
    role: str
    knobs: dict[str, Any]
    dtypes: set[str]  # input dtypes it is run at
    expect: str


def variants(
    spec: dict, include_infeasible: bool, controls: bool, extra: list[dict[str, Any]] | None = None
) -> list[Variant]:
    """Round-0 knob sets (those the expert generator proposes for this spec), the controls and any
    extra knob sets (tuning candidates: round-0 sets with some knobs overridden)."""
    out = [
        Variant(name=f"r0-{i}", role="round0", knobs=k, dtypes=set(at.FLOAT_DTYPES), expect="pass")
        for i, k in enumerate(at.ROUND0)
        if include_infeasible or at.feasible(spec, k)
    ]
    out += [
        Variant(name=f"x-{i}", role="extra", knobs=k, dtypes=set(at.FLOAT_DTYPES), expect="pass")
        for i, k in enumerate(extra or [])
    ]
    if controls and out:
        base = out[0].knobs
        out += [
            Variant(
                name=f"ctl-qk-{qk}",
                role="control",
                knobs={**base, "qk32": qk},
                dtypes={"float32"},
                expect="fails the x8 seed at large D: fp32-accumulated scores",
            )
            for qk in ("ieee", "tf32x3")
        ]
        out.append(
            Variant(
                name="ctl-p-single",
                role="control",
                knobs={**base, "p16": "single"},
                dtypes={"float16", "bfloat16"},
                expect="bf16 fails the x8 seed: P rounded to 8 bits before P V",
            )
        )
    return out


def _extra(text: str) -> dict[str, Any]:
    return knobs_with(at, json.loads(text))


def _dtype(problem: loading.Problem, shape: dict) -> str:
    x = next(t for t in problem.inputs(shape, 0, "meta") if isinstance(t, torch.Tensor))
    return str(x.dtype).removeprefix("torch.")


def _compare(got: torch.Tensor, expected: torch.Tensor, tol: float, seed: int) -> SeedResult:
    max_abs_err, bad, numel = compare(got, expected, tol)
    return SeedResult(seed=seed, max_abs_err=max_abs_err, bad=bad, numel=numel, passed=bad == 0)


def _device_variant(inputs: list, seed: int, device: str) -> list:
    """The tool's own recipe, drawn on the device (seed 0 as drawn; later seeds signed normal, x8 on even
    seeds): the gate's before issue 35, which now draws Pareto and wider spans (child/draws.py)."""
    if seed == 0:
        return inputs
    g = torch.Generator(device=device).manual_seed(seed)
    scale = 1.0 if seed % 2 else 8.0
    return [
        (torch.randn(x.shape, generator=g, device=device) * scale).to(x.dtype)
        if isinstance(x, torch.Tensor) and x.is_floating_point()
        else x
        for x in inputs
    ]


def _median(timer: timing.Timer, fn, reps: int, calls: int) -> float:
    return statistics.median(timer(fn, calls) for _ in range(reps))


def check_shape(
    problem: loading.Problem,
    shape: dict,
    kind: str,
    draw: str,
    cands: list[tuple[Variant, Any]],
    args: argparse.Namespace,
    log,
) -> list[Row]:
    dev = args.device
    dtype = _dtype(problem, shape)
    tol = problem.tolerance.get(dtype, 1e-4)
    label = shape_label(shape)
    run = [(v, m) for v, m in cands if dtype in v.dtypes]
    rows = {
        "eager": Row(
            shape=label,
            dtype=dtype,
            shape_kind=kind,
            draw=draw,
            variant="eager",
            role="eager",
            expect="-",
            knobs={},
            tolerance=tol,
        )
    }
    models: dict[str, Any] = {}
    for v, module in run:
        rows[v.name] = Row(
            shape=label,
            dtype=dtype,
            shape_kind=kind,
            draw=draw,
            variant=v.name,
            role=v.role,
            expect=v.expect,
            knobs=v.knobs,
            tolerance=tol,
        )
        try:
            models[v.name] = loading.build(problem, module, shape, dev)[1]
        except Exception as e:  # a render that cannot even be built is a result, not a crash
            rows[v.name].error = f"build: {type(e).__name__}: {e}"[:500]
    ref, _ = loading.build(problem, None, shape, dev)
    ref64 = copy.deepcopy(ref).to(torch.float64)
    with torch.no_grad():
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            # the problem's own draw, then the signed (x8 on even seeds) variants: the gate's, or its recipe
            drawn = problem.inputs(shape, seed, dev)
            varied = draws.variant(drawn, seed) if draw == "gate" else _device_variant(drawn, seed, dev)
            inputs = [loading.to_device(x, dev) for x in varied]
            del drawn, varied
            expected = loading.outputs(ref64(*[loading.to_device(x, dev, torch.float64) for x in inputs]))[0]
            sync(dev)
            log(f"  {label} seed {seed}: inputs + float64 reference {time.perf_counter() - t0:.1f}s")
            rows["eager"].seeds.append(_compare(loading.outputs(ref(*inputs))[0], expected, tol, seed))
            for name, model in models.items():
                if rows[name].error:
                    continue
                t0 = time.perf_counter()
                try:
                    got = loading.outputs(model(*inputs))[0]
                    sync(dev)
                except Exception as e:
                    rows[name].error = f"seed {seed}: {type(e).__name__}: {e}"[:500]
                    continue
                r = _compare(got, expected, tol, seed)
                rows[name].seeds.append(r)
                log(
                    f"    {name:14s} seed {seed}: max abs {r.max_abs_err:.3g}, {r.bad} bad "
                    f"({time.perf_counter() - t0:.1f}s with any compile)"
                )
                del got
            del inputs, expected
            gc.collect()
            if dev == "cuda":
                torch.cuda.empty_cache()
        if args.reps > 0:
            timer = timing.Timer(dev)
            inputs = problem.inputs(shape, 100, dev)  # what the benchmarker times on
            fns = {"eager": lambda: ref(*inputs)}
            fns |= {n: (lambda m=m: m(*inputs)) for n, m in models.items() if not rows[n].error}
            for name, fn in list(fns.items()):  # warm-up (and any compile left)
                try:
                    fn()
                except Exception as e:
                    rows[name].error = f"timing: {type(e).__name__}: {e}"[:500]
                    del fns[name]
            calls = timer.calls_for(*fns.values())  # batched calls where one is launch-jitter short
            for name, fn in fns.items():
                try:
                    rows[name].median_s = _median(timer, fn, args.reps, calls)
                except Exception as e:
                    rows[name].error = f"timing: {type(e).__name__}: {e}"[:500]
            for row in rows.values():
                row.eager_median_s = rows["eager"].median_s
                if row.median_s:
                    row.speedup = row.eager_median_s / row.median_s
            del inputs, fns
    for row in rows.values():
        row.passed = None if row.error else all(s.passed for s in row.seeds)
    return list(rows.values())


def _short(knobs: dict[str, Any]) -> str:
    if not knobs:
        return "torch"
    p = at.precision(knobs)
    tiles = "/".join(str(knobs[k]) for k in ("block_m", "block_n", "block_d", "block_dv") if k in knobs)
    return (
        f"{knobs['strategy']} {tiles} w{knobs['num_warps']}s{knobs['num_stages']} "
        f"qk={p['qk32']} pv={p['pv32']} p16={p['p16']}"
    )


def _compact(label: str) -> str:
    """batch_size=32,num_heads=32,...,dtype=torch.float32 -> 32x32x512x1024"""
    dims = [kv.split("=", 1)[1] for kv in label.split(",") if "=" in kv and not kv.startswith("dtype=")]
    return "x".join(dims)[:44] or label[:44]


def table(rows: list[Row]) -> str:
    head = (
        f"{'shape':44s} {'dtype':8s} {'variant':14s} {'knobs':52s} {'max abs err per seed':26s} "
        f"{'bad':>9s} {'ok':4s} {'ms':>9s} {'eager':>9s} {'x':>6s}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        errs = " ".join(f"{s.max_abs_err:.1e}" for s in r.seeds)
        bad = sum(s.bad for s in r.seeds)
        ok = "ERR" if r.error else ("yes" if r.passed else "NO")
        ms = f"{r.median_s * 1e3:9.3f}" if r.median_s else f"{'-':>9s}"
        eager = f"{r.eager_median_s * 1e3:9.3f}" if r.eager_median_s else f"{'-':>9s}"
        x = f"{r.speedup:6.2f}" if r.speedup else f"{'-':>6s}"
        lines.append(
            f"{_compact(r.shape):44s} {r.dtype:8s} {r.variant:14s} {_short(r.knobs)[:52]:52s} {errs:26s} "
            f"{bad:9d} {ok:4s} {ms} {eager} {x}"
        )
        if r.error:
            lines.append(f"    error: {r.error[:200]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="where to write the JSON report")
    ap.add_argument("--problem", type=Path, default=DEFAULT_PROBLEM, help="the SDPA problem file")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--seeds", type=int, default=3, help="gate seeds (default 3, as the gate)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per render and shape (0: no timing)")
    ap.add_argument(
        "--shapes",
        default="all",
        choices=("all", "gate", "ladder"),
        help="the gate's shapes, KB_SHAPES or both",
    )
    ap.add_argument(
        "--draw",
        default="device",
        choices=("device", "gate"),
        help="seed variants at the KB_SHAPES: drawn on the device (default) or the gate's host-side draw",
    )
    ap.add_argument("--all-round0", action="store_true", help="also the round-0 sets infeasible at the spec")
    ap.add_argument("--no-controls", action="store_true", help="only the round-0 renders")
    ap.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="JSON",
        help='an extra knob set: overrides on the first round-0 set of its strategy, e.g. \'{"strategy": '
        '"full_d", "block_m": 128}\' (repeatable)',
    )
    args = ap.parse_args(argv)
    if not device_ok("attn_check", args.device):
        return 2
    log = Log()
    _, problem, analysis = trace(args.problem, args.device)
    spec = at.matches(analysis["ops"])
    if spec is None:
        print(
            f"attn_check: {args.problem} does not trace to a lone SDPA; pass an SDPA problem", file=sys.stderr
        )
        return 2
    import triton

    report = Report(
        problem=str(args.problem.relative_to(ROOT) if args.problem.is_relative_to(ROOT) else args.problem),
        device=args.device,
        gpu=device_name(args.device),
        torch=torch.__version__,
        triton=triton.__version__,
        spec=spec,
        seeds=args.seeds,
        reps=args.reps,
    )
    cands = [
        (v, loading.load_module(at.render(spec, v.knobs, analysis["signature"]), "cand"))
        for v in variants(spec, args.all_round0, not args.no_controls, [_extra(e) for e in args.extra])
    ]
    log(f"spec {spec}; {len(cands)} renders: {', '.join(v.name for v, _ in cands)}")
    if args.device == "cpu":
        shapes = [(s, "cpu", "gate") for s in problem.gate_shapes("cpu")]
    else:
        # the gate's own shapes first: cheap, and exactly what a kb run checks
        shapes = [(s, "gate", "gate") for s in problem.gate_shapes("cuda") if args.shapes in {"all", "gate"}]
        shapes += [(s, "ladder", args.draw) for s in problem.shapes if args.shapes in {"all", "ladder"}]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for shape, kind, draw in shapes:
        log(f"shape {shape_label(shape)} ({kind}, {draw} draw)")
        report.rows += check_shape(problem, shape, kind, draw, cands, args, log)
        report.wall_s = log.elapsed()
        args.out.write_text(report.model_dump_json(indent=1))  # partial results survive a time limit
    print(table(report.rows))
    failed = [r.variant for r in report.rows if r.role == "round0" and r.passed is not True]
    log(f"wrote {args.out}; round-0 renders failing: {', '.join(sorted(set(failed))) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
