"""A rung's bench, the host's side: the candidate timed beside the reference in its child, its times held
against the worker's own clock around each timed batch (runtime/wall_clock.py), then the reference timed
again alone in the judge's child, where no candidate code ever ran.

The ratio is measured side by side, in one process. A reference that ran slower beside the candidate
than alone, past noise, was slowed by it, however that was done (a patch that restores itself before
the checks, one below Python): a `policy` fault.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbrain.core import handoff
from kernelbrain.core.protocol import (
    BenchReply,
    BenchRequest,
    DuelReply,
    DuelRequest,
    KeptCall,
    KeptRequest,
    ReferenceTimeRequest,
)
from kernelbrain.core.scoring import reference_moved
from kernelbrain.runtime import scratch, wall_clock
from kernelbrain.runtime.faults import SandboxError, SandboxFault

if TYPE_CHECKING:
    from kernelbrain.runtime.sandbox import Sandbox

# clean timings of the reference taken again where the first makes it look slowed beside a candidate
CLEAN_RETIMES = 2


def bench(
    box: Sandbox, request: BenchRequest, *, timeout_s: float, task: str = "-", own_code: bool = False
) -> tuple[BenchReply, float]:
    """The rung on `box`'s child, each shape's reference time alone added; the busy seconds of both."""
    # started with the benchmarker's child (BenchmarkerRole.warms_judge): the child writes the checked
    # timed calls' outputs into the outbox it shares with the judge
    judge = box.start_judge()
    _, outbox = box.gate_folders()
    if not own_code:  # kb's own renders are compared in their child, as before: no round trip for them
        scratch.empty(outbox)
        request = request.model_copy(update={"outbox": str(outbox)})
    timed, busy = box.ask(request, timeout_s=timeout_s, task=task, own_code=own_code)
    # the worker's own clock around each timed batch: the child's times must agree with it
    sides = [
        wall_clock.Sides(
            s.shape, s.calls, ["ref", "cand"] * s.repeats, {"ref": s.ref_median_s, "cand": s.cand_median_s}
        )
        for s in timed.shapes
    ]
    walls = wall_clock.witness(box.marks, sides, request.device, "ref", "cand")
    # a candidate from outside's kept timed calls' outputs, compared in the judge (the child that ran them
    # is stopped first): a fault there is the candidate's, as it was in its own child
    busy_kept = 0.0
    if request.outbox is not None:
        busy_kept = judge_kept(box, request, timed.kept, handoff.BENCH_SEED, timeout_s, task)
    busy_alone = 0.0
    clean: list[tuple[float, float]] = []  # per shape: the slowest clean time so far, and its IQR
    # the reference's time alone, timed again (up to CLEAN_RETIMES times) while it looks moved: a
    # reference of microseconds varies by 2x between clean timings, and only the slowest of them is
    # evidence against the candidate
    moved: list[float | None] = []
    attempt = 0
    for attempt in range(1 + CLEAN_RETIMES):
        try:
            alone, spent = judge.ask(
                _alone(request, timed, fresh=attempt > 0), timeout_s=timeout_s, task=task
            )
        except SandboxFault as e:
            raise SandboxError(f"the judge's child failed timing the reference alone: {e}") from None
        busy_alone += spent
        timings = list(zip(alone.medians_s, alone.iqrs_s, strict=True))
        if clean:  # the slower of each shape's clean times
            timings = [t if t[0] > c[0] else c for c, t in zip(clean, timings, strict=True)]
        clean = timings
        moved = [
            reference_moved(s.ref_median_s, s.ref_iqr_s, median, iqr, request.device)
            for s, (median, iqr) in zip(timed.shapes, clean, strict=True)
        ]
        if all(m is None for m in moved):
            break
    box.bench_phases = {"bench": busy, "kept": busy_kept, "alone": busy_alone, "clean_timings": attempt + 1}
    box.bench_phases.update({f"bench.{k}": v for k, v in timed.steps.items()})
    for s, (median, _), m in zip(timed.shapes, clean, moved, strict=True):
        if m is not None:
            raise SandboxFault(
                "policy",
                f"benchmark shape {s.shape}: the reference ran {m:.2f}x slower beside the candidate "
                f"({s.ref_median_s:.3g} s) than in a process where no candidate ran ({median:.3g} s, the "
                f"slowest of {attempt + 1} timings there): the candidate slowed the reference it is "
                "timed against",
            )
    shapes = [
        s.model_copy(update={"ref_alone_median_s": c[0], "wall_speedup": w})
        for s, c, w in zip(timed.shapes, clean, walls, strict=True)
    ]
    return timed.model_copy(update={"shapes": shapes}), busy + busy_kept + busy_alone


def duel(
    box: Sandbox, request: DuelRequest, *, timeout_s: float, task: str = "-", own_code: bool = False
) -> tuple[DuelReply, float]:
    """A duel on `box`'s child, its times held against the worker's clock, and a candidate from outside's
    kept timed calls checked by the judge, as a bench's."""
    if not own_code:
        box.start_judge()
        _, outbox = box.gate_folders()
        scratch.empty(outbox)
        request = request.model_copy(update={"outbox": str(outbox)})
    timed, busy = box.ask(request, timeout_s=timeout_s, task=task, own_code=own_code)
    wall_clock.duel(timed, request.repeats, box.marks, request.device)
    if request.outbox is not None:
        busy += judge_kept(box, request, timed.kept, handoff.DUEL_SEED, timeout_s, task)
    return timed, busy


def judge_kept(
    box: Sandbox,
    request: BenchRequest | DuelRequest,
    kept: list[KeptCall],
    seed: int,
    timeout_s: float,
    task: str,
) -> float:
    """The judge's check of the kept timed calls' outputs in the outbox (emptied after); its busy seconds.
    A mismatch is the candidate's fault, as it was in its own child."""
    judge = box.start_judge()
    _, outbox = box.gate_folders()
    _, busy = judge.ask(
        KeptRequest(
            problem_source=request.problem_source,
            device=request.device,
            fits=request.fits,
            accuracy=request.accuracy,
            which=request.which,
            folder=str(outbox),
            kept=kept,
            seed=seed,
        ),
        timeout_s=timeout_s,
        task=task,
    )
    scratch.empty(outbox)
    return busy


def _alone(request: BenchRequest, timed: BenchReply, fresh: bool) -> ReferenceTimeRequest:
    """The reference alone at the bench's shapes and calls per sample; `fresh`: not the judge's kept time."""
    return ReferenceTimeRequest(
        problem_source=request.problem_source,
        device=request.device,
        fits=request.fits,
        accuracy=request.accuracy,
        which=request.which,
        calls=[s.calls for s in timed.shapes],
        repeats=request.repeats,
        warmup=request.warmup,
        fresh=fresh,
    )
