"""The worker's own evidence of a bench's and a duel's times: the child is not their only witness.

Each timed batch is marked on the protocol pipe as it starts and ends (kernelbrain/child/marks.py), and
the worker stamps each mark with its own monotonic clock as it comes in. Code in the child can fake the
child's clocks or edit its list of samples through stack frames; it cannot move the worker's clock. Per
shape and side, the median of the worker's batch times, less what a batch costs beyond its timed calls,
must agree with the median the child reports: a fake-fast clock shows as a gap, a side whose reported
time is longer than the wall clock around it is impossible. Both are `policy`.

What a batch costs beyond its calls (the marks' trip through the pipe, ~0.1 ms at worst, the worker's
wake-up, on a GPU the L2 flush and the synchronisation) is alike for both sides: the smaller of the two
sides' gaps between wall and reported time is taken as it. The noise bound is `WALL_SLACK`, relative and
absolute a batch: on a GPU a batch lasts 200 us or more and the flush (~0.1 ms on an H100/H200) can hide
part of one side's launches, so a batch may differ by 100 us plus a quarter (a first bound, to measure on
the H200: `ShapeTiming.wall_speedup` records the worker's side); on the CPU the interpreter's samples last
milliseconds to seconds, and the worker's wake-up on a loaded machine takes up to tens of milliseconds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from kernelbrain.core.protocol import DuelReply
from kernelbrain.runtime.faults import SandboxFault

# (relative, seconds a batch): how far the worker's wall time of a batch, less the batches' overhead, may
# exceed the child's time for it before the child's time is a lie
WALL_SLACK = {"cuda": (0.25, 100e-6), "cpu": (0.5, 20e-3)}


@dataclass(frozen=True)
class Sides:
    """One shape's timed batches as the child reports them: their labels in the order they ran, the calls
    a batch, and per label the median seconds a call."""

    shape: str
    calls: int
    order: list[str]
    reported: dict[str, float]


def batches(marks: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """(label, wall seconds) per batch, from its start and end marks; a `policy` fault where the marks
    are not pairs of a start and its end (something in the child wrote marks of its own)."""
    found = []
    if len(marks) % 2:
        raise SandboxFault("policy", f"the child's batch marks come unpaired ({len(marks)} marks)")
    for (label, start), (end, stop) in zip(marks[::2], marks[1::2], strict=True):
        if label.startswith("/") or end != f"/{label}":
            raise SandboxFault("policy", f"the child's batch marks are out of order ({label!r}, {end!r})")
        found.append((label, stop - start))
    return found


def witness(
    marks: list[tuple[str, float]], shapes: list[Sides], device: str, first: str, second: str
) -> list[float]:
    """Per shape, the speedup of `second` over `first` on the worker's clock (first's wall time a call over
    second's, each less the batches' overhead). Raises a `policy` SandboxFault where the marks do not
    match the samples or a side's reported time is not its wall time within WALL_SLACK, in one line with
    both speedups."""
    timed = batches(marks)
    expected = [(s, label) for s in shapes for label in s.order]
    if [label for label, _ in timed] != [label for _, label in expected]:
        raise SandboxFault(
            "policy",
            f"the child's {len(timed)} timed batches, as it marked them, are not the {len(expected)} "
            "batches its samples say it timed",
        )
    rel, slack = WALL_SLACK.get(device, WALL_SLACK["cpu"])
    speedups = []
    at = 0
    for s in shapes:
        mine = timed[at : at + len(s.order)]
        at += len(s.order)
        wall = {
            label: statistics.median(t / s.calls for lb, t in mine if lb == label) for label in s.reported
        }
        overhead = max(0.0, min(wall[label] - s.reported[label] for label in s.reported))
        clean = {label: wall[label] - overhead for label in s.reported}
        speedup = clean[first] / clean[second] if clean[second] > 0 else 0.0
        for label, reported in s.reported.items():
            fast = clean[label] > reported * (1 + rel) + slack / s.calls
            slow = reported > wall[label] * (1 + rel) + slack / s.calls
            if fast or slow:
                said = s.reported[first] / s.reported[second] if s.reported[second] > 0 else 0.0
                raise SandboxFault(
                    "policy",
                    f"benchmark shape {s.shape}: in-process speedup {said:.3g}x against {speedup:.3g}x on "
                    f"the worker's wall clock ({label}: {reported:.3g} s a call in its process, "
                    f"{clean[label]:.3g} s on the worker's clock less the batches' overhead): the times "
                    "were faked in the child",
                )
        speedups.append(speedup)
    return speedups


def duel(reply: DuelReply, repeats: int, marks: list[tuple[str, float]], device: str) -> None:
    """A duel's times held against the worker's clock alike (A, B, B, A, ...: child/timing.py)."""
    order = [side for i in range(repeats) for side in (("A", "B") if i % 2 == 0 else ("B", "A"))]
    sides = [Sides(d.shape, d.calls, order, {"A": d.a_median_s, "B": d.b_median_s}) for d in reply.shapes]
    witness(marks, sides, device, "A", "B")
