"""Where a candidate's time goes: per-kernel GPU time of expert-template renders at one problem shape.

Renders each knob set (overrides on the family's first round-0 set of the same strategy, as
tools/gpu_template_check.py takes them), runs it and eager PyTorch a few times at one of the problem's
KB_SHAPES under torch.profiler, and prints each kernel's total and per-call GPU time: the split a
multi-kernel strategy (attention's materialized, split_row's launches) needs before it can be tuned.

    python3 tools/kernel_breakdown.py benchmarks/problems/sdp_attn.py --shape 0 \\
        --knobs '{"strategy": "materialized"}' [--calls 5] [--host] [--out $OUT/breakdown.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; appended, so an installed kb (tools/device_env.sh) comes first
    sys.path.append(str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from kernelbrain.child import loading  # noqa: E402
from kernelbrain.core.problem import shape_label  # noqa: E402
from kernelbrain.templates import knobs_with  # noqa: E402
from tools.gpu_setup import host_us, match_family, trace  # noqa: E402


def _kernels(fn, calls: int) -> list[dict]:
    """Per-kernel GPU time over `calls` calls of fn (after one untimed call that compiles)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [
        {
            "kernel": e.key[:90],
            "count": e.count,
            "total_ms": e.device_time_total / 1e3,
            "per_call_ms": e.device_time_total / 1e3 / calls,
        }
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]
    return sorted(rows, key=lambda r: -r["total_ms"])


def _host(fn, calls: int) -> dict:
    """Host time a call (tools/gpu_setup.host_us, one round of `calls`), and where cProfile sees that
    time go (the top functions by own time)."""
    host = host_us(fn, calls, rounds=1)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
    return {"host_us_per_call": host, "cprofile_top": text.getvalue()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", type=Path)
    ap.add_argument("--shape", type=int, default=0, help="index into the problem's KB_SHAPES (default 0)")
    ap.add_argument("--knobs", action="append", default=[], metavar="JSON", help="a knob set (repeatable)")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--host", action="store_true", help="also the host time a call, and where it goes")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("kernel_breakdown: needs a CUDA device (torch.profiler's CUDA activity)", file=sys.stderr)
        return 2
    source, problem, analysis = trace(args.problem, "cuda")
    family, spec = match_family(source, analysis)
    shape = problem.shapes[args.shape]
    report = {"problem": args.problem.name, "shape": shape_label(shape), "renders": []}
    with torch.no_grad():
        ref, _ = loading.build(problem, None, shape, "cuda")
        inputs = problem.inputs(shape, 100, "cuda")
        entries = [("eager", None, ref)]
        for text in args.knobs:
            knobs = knobs_with(family, json.loads(text))
            if not family.feasible(spec, knobs):
                print(f"skipped (infeasible at the traced shape): {json.dumps(knobs)}", flush=True)
                continue
            try:
                cand = loading.load_module(family.render(spec, knobs, analysis["signature"]), "cand")
                _, new = loading.build(problem, cand, shape, "cuda")
            except Exception as e:  # one bad knob set must not hide the others' numbers
                print(f"render failed: {json.dumps(knobs)}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            entries.append((json.dumps(knobs), knobs, new))
        for name, knobs, model in entries:
            try:
                rows = _kernels(lambda m=model: m(*inputs), args.calls)
            except Exception as e:  # one render out of resources must not hide the others' numbers
                print(f"\n{report['shape']}  {name}: failed: {type(e).__name__}: {str(e)[:200]}")
                report["renders"].append({"name": name, "knobs": knobs, "error": f"{type(e).__name__}: {e}"})
                continue
            total = sum(r["per_call_ms"] for r in rows)
            report["renders"].append({"name": name, "knobs": knobs, "per_call_ms": total, "kernels": rows})
            print(f"\n{report['shape']}  {name}: {total:.3f} ms a call")
            for r in rows[:8]:
                print(f"  {r['per_call_ms']:9.3f} ms  x{r['count'] // args.calls:<3d} {r['kernel']}")
            if args.host:
                host = _host(lambda m=model: m(*inputs), 50)
                report["renders"][-1]["host"] = host
                print(f"  host: {host['host_us_per_call']:.1f} us a call")
                print("\n".join(host["cprofile_top"].splitlines()[:30]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
