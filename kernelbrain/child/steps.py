"""Seconds per step of a child's request (a trial, a bench), summed where a step repeats over shapes and
seeds: what tools/gate_phases.py splits a gate's and a rung's cost by."""

from __future__ import annotations

import time

_clock = time.perf_counter  # bound before candidate code loads (as child/timing.py's clocks)


class Steps:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.mark = _clock()

    def done(self, step: str) -> None:
        """Charge the time since the last mark to `step`."""
        now = _clock()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self.mark
        self.mark = now
