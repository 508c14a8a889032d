"""Profiling a candidate: the analytical roofline against measured ceilings, and Nsight Compute."""

from __future__ import annotations

import gc
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from kernelbrain.child import marks
from kernelbrain.child.analysis import flops_and_bytes
from kernelbrain.child.loading import (
    Problem,
    build,
    load_module,
)
from kernelbrain.child.timing import Timer

_CEILINGS: dict[str, dict[str, float]] = {}


def ceilings(device: str) -> dict[str, float]:
    """Measured copy bandwidth (bytes/s) and fp32 matmul rate (FLOP/s) of this device, once per child."""
    if device in _CEILINGS:
        return _CEILINGS[device]
    timer = Timer(device)
    n = (256 if device == "cuda" else 8) * 1024 * 1024
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    copy_t = min(timer(lambda: dst.copy_(src)) for _ in range(5))
    m = 4096 if device == "cuda" else 512
    a, b = torch.rand(m, m, device=device), torch.rand(m, m, device=device)
    mm_t = min(timer(lambda: a @ b) for _ in range(5))
    _CEILINGS[device] = {"bandwidth_Bps": 2 * n * 4 / copy_t, "matmul_flops": 2 * m**3 / mm_t}
    return _CEILINGS[device]


def roofline(
    problem_source: str,
    cand_source: str,
    device: str,
    repeats: int = 5,
    flops: float | None = None,
    nbytes: float | None = None,
) -> dict:
    """Achieved fractions of the measured memory and compute ceilings at the primary shape. `flops`
    and `nbytes`: the reference's counts there, as the run's analysis recorded them (counting again
    runs the reference again in every profiler child)."""
    problem = Problem(problem_source)
    cand = load_module(cand_source, "cand")
    shape = problem.ladder_shapes(device, "primary")[0]
    if flops is None or nbytes is None:
        flops, nbytes = flops_and_bytes(problem, shape, device)
    with marks.on_device():  # the worker holds the device's lock shared from here (a compile lets it go)
        _, new = build(problem, cand, shape, device)
        inputs = problem.inputs(shape, 7, device)
        timer = Timer(device)
        with torch.no_grad():
            if device == "cuda":
                new(*inputs)  # compiles; under the interpreter nothing does, and a call takes seconds
    with torch.no_grad():
        marks.ready()  # built, drawn and compiled sharing the device: the timing and the ceilings alone
        gc.collect()
        gc.disable()
        try:
            median = statistics.median(timer(lambda: new(*inputs)) for _ in range(repeats))
        finally:
            gc.enable()
    ceil = ceilings(device)
    floor_s = max(nbytes / ceil["bandwidth_Bps"], flops / ceil["matmul_flops"])
    return {
        "time_s": median,
        "bytes": nbytes,
        "flops": flops,
        "arith_intensity": flops / nbytes if nbytes else math.inf,
        "ridge_intensity": ceil["matmul_flops"] / ceil["bandwidth_Bps"],
        "dram_frac": nbytes / median / ceil["bandwidth_Bps"],
        "compute_frac": flops / median / ceil["matmul_flops"],
        "floor_frac": floor_s / median,
        "bandwidth_Bps": ceil["bandwidth_Bps"],
        "matmul_flops": ceil["matmul_flops"],
    }


def ncu(problem_source: str, cand_source: str, device: str, timeout_s: float = 400.0) -> dict:
    """Nsight Compute on one forward of the candidate at the primary shape (see kernelbrain.core.nsight)."""
    import subprocess

    from kernelbrain.core import nsight as nsight

    if device != "cuda" or shutil.which("ncu") is None:
        return {"error": "ncu is not on this machine" if device == "cuda" else "ncu needs a GPU"}
    workdir = Path(tempfile.mkdtemp(prefix="ncu-"))
    (workdir / "problem.py").write_text(problem_source)
    (workdir / "candidate.py").write_text(cand_source)
    cmd = nsight.command(sys.executable, str(workdir / "problem.py"), str(workdir / "candidate.py"))
    try:
        code, out, err = run_ready(cmd, workdir, timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"ncu took longer than {timeout_s:g} s"}
    try:
        metrics, kernels = nsight.parse(out)
    except nsight.NcuError as e:
        return {"error": f"{e} (exit {code}): {err.strip()[-300:]}"}
    return {"metrics": metrics, "kernels": kernels, "raw": out}


def run_ready(cmd: list[str], workdir: Path, timeout_s: float) -> tuple[int, str, str]:
    """`cmd` run in `workdir` to its end: its exit code, stdout and stderr. When its target says it
    reaches the device, then ready (child/ncu_target.py), the worker is told (child/marks.py) and,
    holding the GPU's lock shared, then alone, answers; the target is then told to go on. `timeout_s`
    leaves out the waits for the GPU."""
    import subprocess
    import time

    from kernelbrain.child import marks
    from kernelbrain.core.nsight import DEVICE, GO, ON, READY

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir)
    deadline = time.monotonic() + timeout_s
    # the target's handshakes not yet answered: the file it says one with, the worker's answer, the file
    # that tells it to go on
    pending = [(DEVICE, marks.reach_device, ON), (READY, marks.ready, GO)]
    while True:
        try:
            out, err = proc.communicate(timeout=0.02)  # retried, it loses no output
            return proc.returncode, out, err
        except subprocess.TimeoutExpired:
            for shake in [h for h in pending if (workdir / h[0]).exists()]:
                pending.remove(shake)
                _, answer, go = shake
                t0 = time.monotonic()
                answer()
                deadline += time.monotonic() - t0
                (workdir / go).touch()
            if time.monotonic() > deadline:
                proc.kill()
                proc.communicate()
                raise
