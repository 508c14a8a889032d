"""`kb doctor` and `kb export` on a GPU: the parts the CPU tests can only reach through stand-ins.

1. `kb doctor --json`: the GPU, driver, torch/triton builds and the ncu counter probe as this machine
   has them (the CPU tests run the probe against recorded ncu output and a permission error).
2. For every winner recorded in tests/fixtures/h200/session5-b80/ladder/*.db (the ladder arm of
   the run benchmarks/results/RESULTS.md reports, one database per seed problem): `kb export` it, then run
   `python kernel.py --all-shapes` on the GPU in a clean environment (no repo on the path, cwd outside
   it): CUDA-event timing, every KB_SHAPES entry, the float64 check. And `--format kernelbench`: load
   it the way KernelBench does (a module named temp_module from the file) and gate its ModelNew with
   the standalone file's own check.

On the device machine, from the repository root:

    . tools/device_env.sh && python3 tools/gpu_cli_check.py [--out $OUT/gpu_cli_check.json]

Prints what each step saw and exits 1 if any exported kernel fails or doctor finds no GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDED = sorted((ROOT / "tests" / "fixtures" / "h200" / "session5-b80" / "ladder").glob("*.db"))


def kb(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        # the checkout after what PYTHONPATH already has: an installed kb (tools/device_env.sh) comes first
        "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p),
    }
    return subprocess.run(
        [sys.executable, "-m", "kernelbrain", *args], capture_output=True, text=True, env=env, timeout=900
    )


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def winners(db: Path) -> list[str]:
    runs = json.loads(kb("ls", "--db", str(db), "--json").stdout)
    return [r["run_id"] for r in runs if r["winner"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="write the findings here as JSON")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run of this script")
    args = p.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any exported module defines its kernels
    findings: dict = {"exports": []}
    ok = True

    def save() -> None:  # after every step: a timeout still leaves what was seen
        if args.out:
            args.out.write_text(json.dumps(findings, indent=2))

    r = kb("doctor", "--json")
    doctor = json.loads(r.stdout)
    findings["doctor"] = doctor
    save()
    for c in doctor["checks"]:
        print(f"{c['status']:<5} {c['name']:<7} {c['detail']}", flush=True)
    checks = {c["name"]: c for c in doctor["checks"]}
    if checks["gpu"]["status"] != "ok" and args.device == "cuda":
        print("FAIL: doctor sees no GPU")
        ok = False

    work = Path(tempfile.mkdtemp(prefix="kb-gpu-cli-"))
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for recorded in RECORDED:
        db = work / recorded.name
        shutil.copy(recorded, db)  # export only reads, but the recorded files stay untouched regardless
        for run_id in winners(db):
            kernel, kbfile = work / f"{run_id}.py", work / f"{run_id}_kernelbench.py"
            for out, fmt in ((kernel, "standalone"), (kbfile, "kernelbench")):
                e = kb("export", run_id, "--db", str(db), "-o", str(out), "--format", fmt)
                if e.returncode != 0:
                    print(f"FAIL export {run_id} {fmt}: {e.stderr.strip()}")
                    ok = False
            run = subprocess.run(
                [sys.executable, str(kernel), "--all-shapes", "--device", args.device],
                cwd=work,
                env=clean,
                capture_output=True,
                text=True,
                timeout=900,
            )
            print(f"== {recorded.name} {run_id}: python kernel.py --all-shapes (exit {run.returncode})")
            print(run.stdout + run.stderr, flush=True)
            passed = run.returncode == 0 and "speedup" in run.stdout
            # the kernelbench file, loaded as KernelBench loads it, gated by the standalone file's check
            standalone = load(kernel, f"kb_standalone_{run_id.replace('-', '_')}")
            custom = load(kbfile, "temp_module")
            problem = standalone._KbProblem(
                standalone._kb_load_reference(standalone._KB_REFERENCE_SOURCE),
                standalone._KB_DEFAULT_TOLERANCE,
            )
            kb_ok = True
            for shape in problem.check_shapes(args.device):  # the shapes kb's gate checks
                ref, new = problem.build(custom.ModelNew, shape, args.device)
                good, err, tol, detail = standalone._kb_check(problem, ref, new, shape, args.device, 3)
                verdict = "PASS" if good else f"FAIL {detail}"
                label = standalone._kb_shape_label(shape)
                print(f"   kernelbench file at {label}: {verdict} (max abs err {err:.3g}, tolerance {tol:g})")
                kb_ok &= good
            ok &= passed and kb_ok
            findings["exports"].append(
                {
                    "db": recorded.name,
                    "run": run_id,
                    "standalone": run.stdout,
                    "passed": passed,
                    "kernelbench": kb_ok,
                }
            )
            save()
    print("ALL PASSED" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
