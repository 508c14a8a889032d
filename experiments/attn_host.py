"""Where a 16-bit attention call's host time goes, and how much of it kb's timer sees (issue 5's fp16 rung).

At the fp16 shape the round-0 candidate's kernel is faster on the GPU than eager's (0.108 against 0.117
ms, probe4 stage 8), yet kb's timer measured 0.96-1.07x: each timed sample flushes the L2 and then
issues a few calls, so a call whose host time outlasts the flush leaves the GPU waiting. This splits the
candidate's host time a call into the torch glue in `forward` (reshape, contiguous, the output's
allocation), `_launch`'s own Python and the Triton launch (the jit kernel's `run`, replayed with the
arguments `_launch` gave it), and times eager and the candidate with kb's timer both at its usual calls
a sample and at many (where host time hides behind the GPU's).

    python3 experiments/attn_host.py benchmarks/problems/sdp_attn.py --shape 1 [--knobs JSON] [--out F.json]

Its findings (session 5) were in benchmarks/results/h200/probe5/ (README there), removed from the tree after
d69481f: see benchmarks/results/RESULTS.md, "Earlier measurements".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; appended, so an installed kb (tools/device_env.sh) comes first
    sys.path.append(str(ROOT))

import torch  # noqa: E402

from kernelbrain.child import loading, timing  # noqa: E402
from kernelbrain.core.problem import shape_label  # noqa: E402
from kernelbrain.templates import knobs_with  # noqa: E402
from tools.gpu_setup import host_us, match_family, trace  # noqa: E402


def timed_ms(timer: timing.Timer, fns: dict, calls: int, repeats: int = 30) -> dict[str, float]:
    """kb's benchmark timer (L2 flushed before each sample of `calls` calls), interleaved, medians in ms."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            times[k].append(timer(f, calls))
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def captured_launch(mod, kernel_name: str, call) -> tuple:
    """The (args, kwargs) `_launch` passes the jit kernel's run, captured from one call."""
    kernel = getattr(mod, kernel_name)
    seen: list[tuple] = []
    original = kernel.run

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return original(*args, **kwargs)

    kernel.run = spy
    try:
        call()
    finally:
        kernel.run = original
    if len(seen) != 1:
        raise RuntimeError(f"{kernel_name}: {len(seen)} launches a call, expected 1")
    return seen[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", type=Path)
    ap.add_argument("--shape", type=int, default=1, help="index into KB_SHAPES (default 1: the fp16 rung)")
    ap.add_argument("--knobs", default="{}", help="overrides on the family's first round-0 set")
    ap.add_argument("--kernel", default="_attn_short16", help="the one jit kernel the call launches")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("attn_host: needs a CUDA device", file=sys.stderr)
        return 2
    source, problem, analysis = trace(args.problem, "cuda")
    family, spec = match_family(source, analysis)
    shape = problem.shapes[args.shape]
    knobs = knobs_with(family, json.loads(args.knobs))
    if not family.feasible(spec, knobs):
        print(f"attn_host: infeasible at the traced shape: {json.dumps(knobs)}", file=sys.stderr)
        return 1
    mod = loading.load_module(family.render(spec, knobs, analysis["signature"]), "cand")
    report: dict = {"shape": shape_label(shape), "knobs": knobs, "device": torch.cuda.get_device_name()}
    with torch.no_grad():
        ref, new = loading.build(problem, mod, shape, "cuda")
        q, k, v = problem.inputs(shape, 100, "cuda")
        new(q, k, v)  # compiles
        lq, d = q.shape[-2:]
        lk, dv = k.shape[-2], v.shape[-1]

        def glue():
            q3 = q.reshape(-1, lq, d).contiguous()
            k.reshape(-1, lk, d).contiguous()
            v.reshape(-1, lk, dv).contiguous()
            o = torch.empty((q3.shape[0], lq, dv), dtype=q.dtype, device=q.device)
            return o.reshape(*q.shape[:-2], lq, dv)

        q3, k3, v3 = q.reshape(-1, lq, d), k.reshape(-1, lk, d), v.reshape(-1, lk, dv)
        o = torch.empty((q3.shape[0], lq, dv), dtype=q.dtype, device=q.device)
        run_args, run_kwargs = captured_launch(mod, args.kernel, lambda: mod._launch(q3, k3, v3, o))
        kernel = getattr(mod, args.kernel)
        host = {
            "eager forward": host_us(lambda: ref(q, k, v)),
            "kb forward": host_us(lambda: new(q, k, v)),
            "kb torch glue": host_us(glue),
            "kb _launch": host_us(lambda: mod._launch(q3, k3, v3, o)),
            "kb jit run alone": host_us(lambda: kernel.run(*run_args, **run_kwargs)),
        }
        report["host_us_per_call"] = host
        timer = timing.Timer("cuda")
        fns = {"eager": lambda: ref(q, k, v), "kb": lambda: new(q, k, v)}
        usual = timer.calls_for(*fns.values())
        report["timed_ms"] = {
            f"{usual} calls a sample (kb's)": timed_ms(timer, fns, usual),
            "20 calls a sample": timed_ms(timer, fns, 20),
        }
    print(f"{report['shape']}  {json.dumps(knobs)}")
    for name, us in host.items():
        print(f"  host {name:18s} {us:7.1f} us a call")
    for how, t in report["timed_ms"].items():
        ratio = t["eager"] / t["kb"]
        print(f"  timed, {how:24s} eager {t['eager']:.4f} ms  kb {t['kb']:.4f} ms  ({ratio:.2f}x)")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
