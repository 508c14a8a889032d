"""Seconds per step of a child's request (a trial, a bench), summed where a step repeats over shapes and
seeds: what tools/gate_phases.py splits a gate's and a rung's cost by."""

from __future__ import annotations

import time


class Steps:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.mark = time.perf_counter()

    def done(self, step: str) -> None:
        """Charge the time since the last mark to `step`."""
        now = time.perf_counter()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self.mark
        self.mark = now
