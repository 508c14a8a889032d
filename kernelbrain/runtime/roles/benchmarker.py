"""The benchmarker role: a candidate's rung (timed beside the reference), and the interleaved duels the
scheduler asks for before it ranks two candidates on a difference within noise."""

from __future__ import annotations

import time

from kernelbrain.core.accuracy import Accuracy
from kernelbrain.core.events import (
    Adjudicated,
    BenchmarkFailed,
    Event,
    GateCategory,
    RungBenchmarked,
    RungSpec,
)
from kernelbrain.core.protocol import BenchReply, BenchRequest, Device, DuelReply, DuelRequest, Fit
from kernelbrain.core.scoring import DUEL_PAIRS, adjudicate, reference_moved, score
from kernelbrain.core.state import RunState
from kernelbrain.runtime.role import CandidateRole, Task, problem_need
from kernelbrain.store import NewEvent


def duel_request(
    problem_source: str,
    device: Device,
    fits: list[Fit],
    rung: RungSpec,
    a: tuple[str, list[str]],
    b: tuple[str, list[str]],
    accuracy: Accuracy | None = None,
) -> DuelRequest:
    """Two candidates (each its source and the classes of torch ops it may run) dueled at `rung`: twice
    its repeats in pairs, and at least DUEL_PAIRS (the fewest that can clear the verdict's sign test)."""
    return DuelRequest(
        problem_source=problem_source,
        device=device,
        fits=fits,
        accuracy=accuracy,
        a_source=a[0],
        b_source=b[0],
        which=rung.shapes,
        repeats=max(DUEL_PAIRS, 2 * rung.repeats),
        warmup=rung.warmup,
        a_torch_ops=a[1],
        b_torch_ops=b[1],
    )


class BenchmarkerRole(CandidateRole[BenchReply]):
    name = "benchmarker"
    # its child writes the checked timed calls' outputs where the judge reads them: both start together
    warms_judge = True

    def wants_warm(self, state: RunState) -> bool:
        """Once candidates are proposed: a run whose problem fails its analysis, or that no template
        matches, never starts a benchmark child (a torch import, a CUDA context)."""
        return bool(state.candidates) and not state.problem_fault

    def tasks(self, state: RunState) -> list[Task]:
        # adjudications first, then the highest rung: those are what the scheduler's decisions wait on
        duels = [
            Task(f"{state.run_id}/adjudicate/{r.rung}/{r.a}/{r.b}", r.a, r.rung, rival=r.b)
            for r in state.adjudication_tasks()
        ]
        todo = sorted(state.bench_tasks(), key=lambda cr: (-cr[1], cr[0].seq))
        return duels + [Task(f"{state.run_id}/bench/{c.id}/{r}", c.id, r) for c, r in todo]

    def request(self, task: Task, state: RunState) -> BenchRequest:
        assert task.candidate is not None and task.rung is not None
        rung = state.config.rungs[task.rung]
        return BenchRequest(
            problem_source=self.problem_source(state),
            device=state.config.device,
            fits=self.fits(state),
            accuracy=self.accuracy(state),
            cand_source=self.candidate_source(state, task.candidate),
            which=rung.shapes,
            repeats=rung.repeats,
            warmup=rung.warmup,
            torch_ops=self.torch_classes(state, task.candidate),
        )

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        return super().execute(task, state) if task.rival is None else self.duel(task, state)

    def duel(self, task: Task, state: RunState) -> list[NewEvent]:
        assert task.candidate is not None and task.rival is not None and task.rung is not None
        t0 = time.perf_counter()
        request = duel_request(
            self.problem_source(state),
            state.config.device,
            self.fits(state),
            state.config.rungs[task.rung],
            (self.candidate_source(state, task.candidate), self.torch_classes(state, task.candidate)),
            (self.candidate_source(state, task.rival), self.torch_classes(state, task.rival)),
            self.accuracy(state),
        )
        own_code = all(state.candidates[c].proposal.own_code for c in (task.candidate, task.rival))
        asked = self.consult(
            state.config.device,
            request,
            timeout_s=self.timeout_s(state),
            task=task.key,
            started=t0,
            own_code=own_code,
            need=problem_need(state),
            spare=self.spare_wanted(task, state),
        )
        slowed = None if asked.reply is None else self.slowed(state, task, asked.reply)
        if asked.reply is not None and slowed is None:
            outcome, med, q1, q3 = adjudicate(asked.reply.ratios)
            timer, pairs, detail = asked.reply.timer, len(asked.reply.ratios), ""
        else:
            # the pair cannot be re-measured (each ran alone before), or one side slowed the other (either
            # could have done what a check found): neither wins it, nor are they ranked on noise
            outcome, med, q1, q3, timer, pairs = "tie", 1.0, 1.0, 1.0, "failed", 0
            detail = slowed or asked.line
        event = Adjudicated(
            rung=task.rung,
            a=task.candidate,
            b=task.rival,
            pairs=pairs,
            ratio_median=med,
            ratio_q1=q1,
            ratio_q3=q3,
            outcome=outcome,
            timer=timer,
            detail=detail,
        )
        return self.with_charge(state, task, event, asked)

    @staticmethod
    def slowed(state: RunState, task: Task, reply: DuelReply) -> str | None:
        """A side that ran slower in the duel than in its own rung (timed where its rival never ran), past
        the bound a reference slowed beside a candidate has: its rival slowed it (a patch of something
        they share, one that undoes itself before the checks). None where neither moved."""
        assert task.candidate is not None and task.rival is not None and task.rung is not None
        pair = ((task.candidate, task.rival), (task.rival, task.candidate))
        for side, (cid, rival) in zip(("a", "b"), pair, strict=True):
            result = state.candidates[cid].results.get(task.rung)
            alone = {s.shape: s for s in result.shapes} if result is not None else {}
            for d in reply.shapes:
                clean = alone.get(d.shape)
                if clean is None:
                    continue
                median, iqr = (d.a_median_s, d.a_iqr_s) if side == "a" else (d.b_median_s, d.b_iqr_s)
                device = state.config.device
                moved = reference_moved(median, iqr, clean.cand_median_s, clean.cand_iqr_s, device)
                if moved is not None:
                    return (
                        f"{cid} ran {moved:.2f}x slower beside {rival} ({median:.3g} s) than in its own rung "
                        f"({clean.cand_median_s:.3g} s) at {d.shape}: its rival slowed it"
                    )
        return None

    def on_result(self, task: Task, r: BenchReply) -> Event:
        assert task.candidate is not None and task.rung is not None
        return RungBenchmarked(
            candidate=task.candidate, rung=task.rung, shapes=r.shapes, score=score(r.shapes), timer=r.timer
        )

    def on_fault(self, task: Task, category: GateCategory, detail: str) -> Event:
        assert task.candidate is not None and task.rung is not None
        return BenchmarkFailed(candidate=task.candidate, rung=task.rung, category=category, detail=detail)
