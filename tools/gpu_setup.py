"""The setup the GPU tools in tools/ share: whether the asked device can run here, a log stamped with the
seconds since the tool began, the problem read and traced, its template family matched, and the gate's
comparison rule. Imported by the tools after they put the repository root on sys.path (appended: kb itself
is imported installed, from the venv or, on the device machine, tools/device_env.sh's /tmp/kb)."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import torch

from kernelbrain.child import analysis, loading
from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.core.problem import read_problem
from kernelbrain.generators.expert import ExpertGenerator


def device_ok(tool: str, device: str) -> bool:
    """Whether `device` can run here; if not, says why on stderr, prefixed with the tool's name."""
    if device == "cuda" and not torch.cuda.is_available():
        print(f"{tool}: no CUDA device; run it on the GPU machine, or pass --device cpu", file=sys.stderr)
        return False
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton reads it at import: setting it here would be too late
        print(f"{tool}: --device cpu needs TRITON_INTERPRET=1 in the environment", file=sys.stderr)
        return False
    return True


def device_name(device: str) -> str:
    """The GPU's name, or on CPU the processor's."""
    return torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"


def sync(device: str) -> None:
    """Wait for the device's queued work, so a wall-clock time or an error belongs to what ran."""
    if device == "cuda":
        torch.cuda.synchronize()


class Log:
    """Prints a message stamped with the seconds since the Log was made (the tool's start)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def __call__(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)


class Traced(NamedTuple):
    source: str  # the problem file as read_problem passes it
    problem: loading.Problem
    analysis: dict  # analysis.analyse's: ops, signature, flops, bytes, shapes


def trace(path: Path, device: str) -> Traced:
    """The problem at `path` read through the static check, loaded, and traced on `device`."""
    source = read_problem(path)
    return Traced(source, loading.Problem(source), analysis.analyse(source, device))


def match_family(source: str, analysis: dict) -> tuple[ModuleType, dict]:
    """The template family the expert generator picks for the traced problem, and its spec."""
    return ExpertGenerator().match_family(ProblemAnalysed(**analysis, families=[]), problem_source=source)


def compare(got: torch.Tensor, expected: torch.Tensor, tol: float) -> tuple[float, int, int]:
    """The gate's rule against a float64 reference: isclose(atol = rtol = tol), NaN/Inf only where the
    reference has them. (max abs error, elements outside it, elements)"""
    g64 = got.detach().to(torch.float64)
    bad_e = ~torch.isfinite(expected)
    ok = bad_e | torch.isclose(g64, expected, rtol=tol, atol=tol)  # NaN/Inf against a finite value: bad
    diff = (g64 - expected).abs().masked_fill(bad_e, 0).nan_to_num(nan=float("inf"))
    return float(diff.max()), int((~ok).sum()), ok.numel()


def host_us(fn, calls: int = 200, rounds: int = 5) -> float:
    """Host time a call, in us: `calls` calls issued back to back and timed before the closing sync (the
    GPU's launch queue absorbs them, so the loop's time is what the host spends); the median over
    `rounds`, after one untimed call."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)
