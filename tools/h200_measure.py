"""Issue 5's measurement: kb against eager PyTorch and torch.compile on the six seed problems.

Phases, each a subcommand (tools/h200_measure.sh runs them on the device machine):

  ceilings  the two physical ceilings of this GPU: device-to-device copy bandwidth and the matmul
            rate per dtype, measured on random data
  search    `kb run` with the expert generator under a fixed GPU-time budget, one database per
            problem; `--arm ladder` uses kb's default ladder, `--arm flat` measures every candidate
            at full fidelity only (the ablation's other arm, same seed, same generator)
  compare   in one process and on the same fresh inputs, per shape: the ladder winner, the flat
            winner, eager PyTorch, torch.compile (default) and torch.compile(mode=
            "max-autotune-no-cudagraphs"), timed interleaved (CUDA events, L2 flushed before each
            sample), medians with their interquartile range; plus the physical floor of the shape
  report    benchmarks/results/h200.json and RESULTS.md from all of the above: speedups, targets
            met or missed (by how much), the ablation, the GPU's busy fraction, the winner's profile

Everything the numbers rest on is recorded: the databases hold every event of the searches.

This file holds the command line and the ceilings and search phases; tools/h200_compare.py the compare
phase, tools/h200_report.py the report, and tools/h200_records.py what they share (the problems, the
arms, the JSON files and a recorded run opened read-only).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; after PYTHONPATH, so an installed kb comes first
    sys.path.append(str(ROOT))

from tools.h200_compare import compare  # noqa: E402
from tools.h200_records import LADDERS, PROBLEMS, dump  # noqa: E402
from tools.h200_report import report  # noqa: E402

# --- ceilings ------------------------------------------------------------------------------------


def ceilings(out: Path, device: str) -> dict:
    import torch

    from kernelbrain.child.timing import Timer

    timer = Timer(device)
    # 2 GiB of fp32 on the GPU: far past the L2 (a token size for a CPU dry run)
    n = (512 if device == "cuda" else 4) * 1024 * 1024
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    copy_t = statistics.median(timer(lambda d=dst, s=src: d.copy_(s)) for _ in range(20))
    del src, dst
    rates = {}
    for name, dtype in (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        m = 8192 if device == "cuda" else 256
        a, b = torch.randn(m, m, device=device, dtype=dtype), torch.randn(m, m, device=device, dtype=dtype)
        a @ b
        t = statistics.median(timer(lambda a=a, b=b: a @ b) for _ in range(10))
        rates[name] = 2 * m**3 / t
    result = {
        "copy_bandwidth_Bps": 2 * n * 4 / copy_t,
        "matmul_flops": rates,
        "note": "copy counts bytes read plus written; fp32 matmul as eager runs it "
        f"(allow_tf32={torch.backends.cuda.matmul.allow_tf32})",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
    }
    dump(out, result)
    print(
        f"copy {result['copy_bandwidth_Bps'] / 1e12:.2f} TB/s; matmul TFLOP/s "
        + ", ".join(f"{k} {v / 1e12:.0f}" for k, v in rates.items())
    )
    return result


# --- search --------------------------------------------------------------------------------------


def search(
    device: str,
    problems: list[str],
    arm: str,
    outdir: Path,
    budget_gpu_s: float,
    max_candidates: int,
    seed: int,
    gpu: int,
    timeout_s: float,
) -> None:
    # each arm compiles into a Triton cache of its own, cold at the start: with one shared cache the arm
    # that compiled a kernel first paid for it, and the other's gate found it compiled (session 4's
    # linear_relu_div: 0.06 s flat gates against 0.6 s ladder ones)
    cache = Path(tempfile.gettempdir()) / f"kb-triton-{arm}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    for name in problems:
        db = outdir / arm / f"{name}.db"
        db.parent.mkdir(parents=True, exist_ok=True)
        db.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "kernelbrain",
            "run",
            str(ROOT / "benchmarks" / "problems" / f"{name}.py"),
            "--db",
            str(db),
            "--device",
            device,
            "--generator",
            "expert",
            "--seed",
            str(seed),
            "--budget-gpu-s",
            str(budget_gpu_s),
            "--max-candidates",
            str(max_candidates),
            "--gpu",
            str(gpu),
            "--quiet",
        ]
        if LADDERS[arm] is not None:
            cmd += ["--ladder", LADDERS[arm]]
        t = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
            tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
        except subprocess.TimeoutExpired:
            tail = [f"timed out after {timeout_s:g} s (the database keeps what was recorded)"]
        print(f"[{arm}] {name}: {time.perf_counter() - t:.0f} s wall; " + " | ".join(tail), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phase", choices=["ceilings", "search", "compare", "report"])
    ap.add_argument("--out", type=Path, required=True, help="working folder (databases, compare JSON)")
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--arm", choices=list(LADDERS), default="ladder")
    ap.add_argument("--budget-gpu-s", type=float, default=90.0)
    ap.add_argument("--max-candidates", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run of the script")
    ap.add_argument("--timeout-s", type=float, default=240.0)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--command", default="bash tools/h200_measure.sh", help="recorded in RESULTS.md")
    a = ap.parse_args()
    problems = [p for p in a.problems.split(",") if p]
    ceil = a.out / "ceilings.json"
    if a.phase == "ceilings":
        ceilings(ceil, a.device)
    elif a.phase == "search":
        search(a.device, problems, a.arm, a.out, a.budget_gpu_s, a.max_candidates, a.seed, a.gpu, a.timeout_s)
    elif a.phase == "compare":
        compare(a.device, problems, a.out, ceil, a.repeats)
    else:
        report(problems, a.out, ceil, a.results, a.command)


if __name__ == "__main__":
    main()
