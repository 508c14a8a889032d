"""The sweep's baselines compiled once before they are timed, beside the runs: torch.compile's first
calls (max-autotune's above all: 9 to 44 s a file on the H100) otherwise hold the device alone while its
CPU compiles, and every run's timing waits.

A child process compiles the winner and both torch.compile modes at the file's own shape and calls each
once, sharing the device (kb's device lock, shared, with the problem's memory reserved). It shares one
thing with the `measure` process that then times them alone: Triton's cache of compiled kernels
(TRITON_CACHE_DIR). Inductor's own caches (its compiled graphs, and the autotuning choices made while
other work ran on the device) stay in a private folder that is removed after, so every choice the timed
baseline makes is made again, alone; only its kernels' compilation is already done.

    python tools/compile_warm.py PROBLEM WINNER_SOURCE --device cuda --modes compile,compile_max
        (the child; prints one JSON line)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMPILE_MODES = {"compile": "default", "compile_max": "max-autotune-no-cudagraphs"}
WARM_TIMEOUT_S = 300.0


def modes(device: str) -> dict[str, str]:
    """The torch.compile modes timed on `device`: on a CPU only the default (the interpreter's timings say
    nothing of speed, and max-autotune takes minutes there)."""
    return {k: m for k, m in COMPILE_MODES.items() if device == "cuda" or m == "default"}


def shared_triton_cache() -> str:
    """The Triton cache this process compiles into, set in its environment so that a child whose Inductor
    cache is elsewhere compiles into the same one."""
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

    os.environ["TRITON_CACHE_DIR"] = path = triton_cache_dir(0)
    return path


def warm(
    problem_source: str, source: str, device: str, need: Any = None, compile_modes: str | None = None
) -> dict[str, Any]:
    """Run the child (module docstring) with `need` reserved, then `device`'s lock held shared; its
    report: per contender the seconds its first call took, cold, or the error that stopped it. A child
    that fails costs nothing but time: the timing compiles on its own. `compile_modes` (comma-separated
    keys of COMPILE_MODES): those alone, else every mode timed on the device."""
    from kernelbrain.runtime import device_room, gpu_lock

    scratch = Path(tempfile.mkdtemp(prefix="kb-warm-"))
    (scratch / "winner.py").write_text(source)
    (scratch / "problem.py").write_text(problem_source)
    env = {**os.environ, "TRITON_CACHE_DIR": shared_triton_cache(), "TORCHINDUCTOR_CACHE_DIR": str(scratch)}
    cmd = [
        sys.executable,
        __file__,
        str(scratch / "problem.py"),
        str(scratch / "winner.py"),
        "--device",
        device,
    ]
    cmd += ["--modes", ",".join(modes(device)) if compile_modes is None else compile_modes]
    name = gpu_lock.device_name(device, None)
    t0 = time.perf_counter()
    try:
        with device_room.on_device(name, need, alone=False):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=WARM_TIMEOUT_S)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"error": f"exit {proc.returncode}: {tail[:300]}", "wall_s": time.perf_counter() - t0}
        return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": time.perf_counter() - t0}
    except subprocess.TimeoutExpired:
        return {"error": f"not done in {WARM_TIMEOUT_S:.0f} s", "wall_s": time.perf_counter() - t0}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _child(problem_file: Path, winner: Path, device: str, keys: list[str]) -> dict[str, Any]:
    import torch

    from kernelbrain.child.loading import Problem, build, load_module

    problem = Problem(problem_file.read_text())
    shape = problem.shapes[0]
    fns = {"kb": build(problem, load_module(winner.read_text(), "winner"), shape, device)[1]}
    fns |= {k: torch.compile(build(problem, None, shape, device)[0], mode=COMPILE_MODES[k]) for k in keys}
    inputs = problem.inputs(shape, 500, device)
    first: dict[str, Any] = {}
    with torch.no_grad():
        for key, fn in fns.items():
            t0 = time.perf_counter()
            try:
                fn(*inputs)
                if device == "cuda":
                    torch.cuda.synchronize()
                first[key] = round(time.perf_counter() - t0, 3)
            except Exception as e:  # the timing meets it again and reports it
                first[key] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return {"first_calls_s": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problem", type=Path)
    ap.add_argument("winner", type=Path, help="the winner's source")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--modes", default="", help="the COMPILE_MODES keys to compile, comma-separated")
    args = ap.parse_args()
    print(json.dumps(_child(args.problem, args.winner, args.device, [k for k in args.modes.split(",") if k])))


if __name__ == "__main__":
    if str(ROOT) not in sys.path:  # kb from the checkout where it is not installed
        sys.path.append(str(ROOT))
    main()
