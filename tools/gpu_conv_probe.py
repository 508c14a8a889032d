"""Accuracy and speed of every conv_transpose round-0 render (plus extra `rows_dense` variants) on the
group_conv seed problem, outside a kb run.

For each shape (on the GPU: the problem's first two KB_SHAPES, the primary one first), every render is
built with Model's weights (evaluate's _build: the gate's construction and state-dict copy), checked
against a float64 reference on fresh random inputs (the gate's draws: seed 0 is the problem's own
non-negative draw, later seeds signed normals, x8 on even seeds) with the gate's isclose(atol = rtol =
tolerance) rule, and timed next to eager PyTorch with the benchmarker's timer (CUDA events, L2 flushed
before each sample, batched calls only where one call is launch-jitter short), median of --reps
samples after a warm-up. Eager is timed before and after the renders, so drift shows.

    . tools/device_env.sh && python3 tools/gpu_conv_probe.py --out $OUT/conv_probe.json     # on the H200
    TRITON_INTERPRET=1 .venv/bin/python tools/gpu_conv_probe.py --device cpu --out /tmp/conv.json

On CPU (the Triton interpreter) it checks tiny shapes only (the smoke shape and a smaller odd one);
the times there say nothing about a GPU. --knobs '{"strategy": "rows_dense", ...}' (repeatable) adds
knob sets of your own.
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

from kernelbrain.child import loading, timing  # noqa: E402
from kernelbrain.core.problem import shape_label  # noqa: E402
from kernelbrain.templates import knobs_with  # noqa: E402
from kernelbrain.templates.compose import conv_transpose as ct  # noqa: E402
from tools.gpu_setup import Log, compare, device_name, device_ok, match_family, sync, trace  # noqa: E402

DEFAULT_PROBLEM = ROOT / "benchmarks" / "problems" / "group_conv.py"
# a tiny shape for a CPU run through the interpreter (slow: one program per output row and block)
CPU_SHAPES = [{"batch_size": 1, "height": 3, "width": 5}]
# H200 device-to-device copy rate (bytes read + written per second), as measured on these machines:
# the floor is the output written plus the input read once at this rate
COPY_BPS = 4.3e12
# rows_dense variants beyond ROUND0's (block_p, block_c, block_k, num_warps): tile length, channel
# block and warps around the defaults
EXTRA_DENSE = [
    (64, 16, 8, 2),
    (64, 16, 8, 4),
    (128, 16, 8, 1),
    (128, 8, 8, 2),
    (256, 16, 8, 2),
    (256, 16, 8, 8),
    (512, 16, 8, 4),
    (512, 16, 8, 8),
]


def variants(extra: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """ROUND0's knob sets in order, then the extra rows_dense ones and --knobs, duplicates dropped."""
    out: list[tuple[str, dict[str, Any]]] = [(f"r0-{i}", dict(k)) for i, k in enumerate(ct.ROUND0)]
    dense = [
        {"strategy": "rows_dense", "block_p": p, "block_c": c, "block_k": k, "num_warps": w}
        for p, c, k, w in EXTRA_DENSE
    ]
    for i, k in enumerate(dense + extra):
        if all(k != known for _, known in out):
            out.append((f"x-{i}", k))
    return out


def _short(knobs: dict[str, Any]) -> str:
    if not knobs:
        return "eager (torch)"
    k = knobs
    return f"{k['strategy']} p{k['block_p']} c{k['block_c']} k{k['block_k']} w{k['num_warps']}"


def _compare(got: torch.Tensor, expected: torch.Tensor, tol: float) -> dict[str, Any]:
    max_abs_err, bad, _ = compare(got, expected, tol)
    return {"max_abs_err": max_abs_err, "bad": bad, "passed": bad == 0}


def probe_shape(
    problem: loading.Problem,
    shape: dict,
    cands: list[tuple[str, dict[str, Any], Any]],
    args: argparse.Namespace,
    log,
) -> list[dict[str, Any]]:
    dev = args.device
    label = shape_label(shape)
    ref, _ = loading.build(problem, None, shape, dev)
    rows: dict[str, dict[str, Any]] = {
        "eager": {"shape": label, "name": "eager", "knobs": {}, "seeds": [], "error": None}
    }
    models: dict[str, Any] = {}
    for name, knobs, module in cands:
        rows[name] = {"shape": label, "name": name, "knobs": knobs, "seeds": [], "error": None}
        try:
            models[name] = loading.build(problem, module, shape, dev)[1]
        except Exception as e:  # a render that cannot be built is a result, not a crash
            rows[name]["error"] = f"build: {type(e).__name__}: {e}"[:500]
    ref64 = copy.deepcopy(ref).to(torch.float64)
    tol = 1e-4
    out_bytes = in_bytes = 0
    with torch.no_grad():
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            drawn = loading.variant(problem.inputs(shape, seed, dev), seed)
            inputs = [loading.to_device(x, dev) for x in drawn]
            expected = loading.outputs(ref64(*[loading.to_device(x, dev, torch.float64) for x in inputs]))[0]
            tol = problem.tolerance_of(inputs[0].dtype)
            in_bytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
            out_bytes = expected.numel() * inputs[0].element_size()
            sync(dev)
            log(f"  {label} seed {seed}: inputs + float64 reference {time.perf_counter() - t0:.1f}s")
            rows["eager"]["seeds"].append(_compare(loading.outputs(ref(*inputs))[0], expected, tol))
            for name, model in models.items():
                if rows[name]["error"]:
                    continue
                t0 = time.perf_counter()
                try:
                    got = loading.outputs(model(*inputs))[0]
                    sync(dev)
                except Exception as e:
                    rows[name]["error"] = f"seed {seed}: {type(e).__name__}: {e}"[:500]
                    continue
                if got.shape != expected.shape:
                    rows[name]["error"] = f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
                    continue
                r = _compare(got, expected, tol)
                rows[name]["seeds"].append(r)
                log(
                    f"    {name:6s} seed {seed}: max abs {r['max_abs_err']:.2e}, {r['bad']} bad "
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
            fns |= {n: (lambda m=m: m(*inputs)) for n, m in models.items() if not rows[n]["error"]}
            for name, fn in list(fns.items()):  # warm-up: compile, caches, clocks
                try:
                    for _ in range(args.warmup):
                        fn()
                    sync(dev)
                except Exception as e:
                    rows[name]["error"] = f"timing: {type(e).__name__}: {e}"[:500]
                    del fns[name]
            calls = timer.calls_for(*fns.values())
            gc.collect()
            gc.disable()  # the interpreter leaves garbage behind: no collection inside a timed call
            try:
                eager_before = statistics.median(timer(fns["eager"], calls) for _ in range(args.reps))
                for name, fn in fns.items():
                    if name != "eager":
                        rows[name]["median_s"] = statistics.median(timer(fn, calls) for _ in range(args.reps))
                eager_after = statistics.median(timer(fns["eager"], calls) for _ in range(args.reps))
            finally:
                gc.enable()
            rows["eager"]["median_s"] = eager = min(eager_before, eager_after)
            rows["eager"]["eager_before_after_s"] = [eager_before, eager_after]
            for row in rows.values():
                if row.get("median_s"):
                    row["speedup"] = eager / row["median_s"]
            del inputs, fns
    floor_s = (in_bytes + out_bytes) / COPY_BPS
    for row in rows.values():
        row["passed"] = None if row["error"] else all(s["passed"] for s in row["seeds"])
        row["tolerance"] = tol
        row["floor_s"] = floor_s
    return list(rows.values())


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'shape':38s} {'name':6s} {'config':36s} {'ms':>9s} {'x eager':>8s} {'x floor':>8s} ok   "
    head += "max abs err"
    lines = [head, "-" * len(head)]
    for r in rows:
        ms = f"{r['median_s'] * 1e3:9.3f}" if r.get("median_s") else f"{'-':>9s}"
        x = f"{r['speedup']:8.2f}" if r.get("speedup") else f"{'-':>8s}"
        fl = f"{r['floor_s'] / r['median_s']:8.2f}" if r.get("median_s") else f"{'-':>8s}"
        ok = "ERR" if r["error"] else ("yes" if r["passed"] else "NO")
        errs = " ".join(f"{s['max_abs_err']:.1e}" for s in r["seeds"])
        lines.append(
            f"{r['shape'][:38]:38s} {r['name']:6s} {_short(r['knobs']):36s} {ms} {x} {fl} {ok:4s} {errs}"
        )
        if r["error"]:
            lines.append(f"    error: {r['error'][:300]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="where to write the JSON report")
    ap.add_argument("--problem", type=Path, default=DEFAULT_PROBLEM)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument(
        "--seeds", type=int, default=2, help="correctness draws per shape (the gate's seeds 0..n-1)"
    )
    ap.add_argument(
        "--reps",
        type=int,
        default=None,
        help="timed samples per render and shape (0: no timing; default 20, 1 on cpu)",
    )
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    ap.add_argument("--shapes", type=int, default=2, help="how many of KB_SHAPES to probe (GPU)")
    ap.add_argument("--knobs", action="append", default=[], help="an extra knob set as JSON (repeatable)")
    ap.add_argument("--only", default="", help="comma-separated strategies to keep (default: all)")
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = 20 if args.device == "cuda" else 1
    if not device_ok("gpu_conv_probe", args.device):
        return 2
    import triton

    log = Log()
    source, problem, analysis = trace(args.problem, args.device)
    family, spec = match_family(source, analysis)
    if family is not ct or not ct.plain_2d(spec):
        print(f"gpu_conv_probe: {args.problem} does not trace to a lone conv_transpose2d", file=sys.stderr)
        return 2
    keep = set(filter(None, args.only.split(",")))
    cands = []
    for name, knobs in variants([knobs_with(ct, json.loads(k)) for k in args.knobs]):
        if keep and knobs["strategy"] not in keep:
            continue
        if not ct.feasible(spec, knobs):
            log(f"{name} {_short(knobs)}: infeasible at {spec}, skipped")
            continue
        cands.append(
            (name, knobs, loading.load_module(ct.render(spec, knobs, analysis["signature"]), "cand"))
        )
    shapes = CPU_SHAPES if args.device == "cpu" else problem.shapes[: args.shapes]
    report: dict[str, Any] = {
        "problem": str(args.problem),
        "device": args.device,
        "gpu": device_name(args.device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "spec": spec,
        "seeds": args.seeds,
        "reps": args.reps,
        "timer": timing.Timer.__doc__.splitlines()[0],
        "rows": [],
    }
    log(f"spec {spec}; {len(cands)} renders; shapes {[shape_label(s) for s in shapes]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for shape in shapes:
        log(f"shape {shape_label(shape)}")
        report["rows"] += probe_shape(problem, shape, cands, args, log)
        report["wall_s"] = log.elapsed()
        args.out.write_text(json.dumps(report, indent=1))  # partial results survive a time limit
    print(table(report["rows"]))
    failed = sorted({r["name"] for r in report["rows"] if r["name"] != "eager" and r["passed"] is not True})
    log(f"wrote {args.out}; renders failing: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
