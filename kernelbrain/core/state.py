"""RunState: one run's log folded into what every worker, the CLI and replay need to know.

One `_apply_<Type>` per event type. Workers derive their tasks from this state and the scheduler its
decisions, so a worker that writes reads its own writes back through the same fold as everyone else.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from kernelbrain.core.errors import RunNotStarted
from kernelbrain.core.events import (
    Adjudicated,
    AdjudicationRequested,
    BenchmarkFailed,
    BudgetCharged,
    CandidateProposed,
    Event,
    EventError,
    GateFailed,
    GatePassed,
    GenerationDone,
    GenerationFailed,
    LeaseExpired,
    ProblemAnalysed,
    ProblemFailed,
    ProfileCaptured,
    Promoted,
    Pruned,
    RunConfig,
    RunFinished,
    RungBenchmarked,
    RunResumed,
    RunStarted,
    TaskFaulted,
    TaskParked,
    decode,
)
from kernelbrain.store import Projection, StoredEvent


@dataclass
class Candidate:
    proposal: CandidateProposed
    seq: int
    ordinal: int  # 0-based order of proposal within the run
    gate: GatePassed | GateFailed | None = None
    results: dict[int, RungBenchmarked] = field(default_factory=dict)
    bench_failed: BenchmarkFailed | None = None
    promotions: dict[int, Promoted] = field(default_factory=dict)  # by rung_from
    pruned: Pruned | None = None
    profile: ProfileCaptured | None = None
    late: bool = False  # proposed after the run finished: never evaluated

    @property
    def id(self) -> str:
        return self.proposal.candidate

    @property
    def admitted(self) -> list[int]:
        """Rungs it may be benchmarked at: 0 once gated, r + 1 once promoted from r."""
        if not isinstance(self.gate, GatePassed):
            return []
        return [0, *sorted(p.rung_to for p in self.promotions.values())]

    @property
    def top_result(self) -> RungBenchmarked | None:
        return self.results[max(self.results)] if self.results else None

    @property
    def terminal(self) -> str | None:
        """Why it needs no more work, or None while it does."""
        if self.late:
            return "proposed after the run finished"
        if isinstance(self.gate, GateFailed):
            return f"gate failed ({self.gate.category})"
        if self.pruned is not None:
            return f"pruned at rung {self.pruned.rung}"
        if self.profile is not None:
            return "finalist (profiled at the top rung)"
        return None


def cost_kind(action: str) -> str:
    """The kind of timed task a charge's action (its task key) was, as RunState.estimate names them:
    `bench/RUNG`, `duel/RUNG`, `profile` (the roofline), `profile/ncu`; else the task's kind."""
    parts = action.split("/")  # RUN/kind/...
    kind = parts[1] if len(parts) > 1 else action
    if kind == "bench" and len(parts) > 3:
        return f"bench/{parts[3]}"
    if kind == "adjudicate" and len(parts) > 2:
        return f"duel/{parts[2]}"
    if kind == "profile":
        return "profile/ncu" if parts[-1] == "ncu" else "profile"
    return kind


def lease_lost(worker: str) -> str:
    """A task's fault line when its lease expired under `worker` (a LeaseExpired)."""
    return f"its worker {worker} died or stalled past its lease"


class RunState(Projection):
    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.started: RunStarted | None = None
        self.resumes: list[RunResumed] = []
        self.analysis: ProblemAnalysed | None = None
        self.problem_failed: ProblemFailed | None = None
        self.candidates: dict[str, Candidate] = {}
        self._live: dict[str, Candidate] = {}  # kept in step with Candidate.terminal, so polls stay cheap
        # per rung, (-score, id) of every candidate that finished it, kept sorted as results arrive
        self.ranking: dict[int, list[tuple[float, str]]] = {}
        self.generation: dict[str, GenerationDone] = {}
        # generation tasks whose service failed, with the session (resumes so far) they failed in: parked
        # until the next `kb resume`
        self.generation_failed: dict[str, tuple[GenerationFailed, int]] = {}
        # lease name -> (session, one line) for each death (LeaseExpired) or raise (TaskFaulted) on it
        self.task_faults: dict[str, list[tuple[int, str]]] = {}
        self.tasks_parked: dict[str, tuple[TaskParked, int]] = {}  # lease name -> (event, its session)
        self.progress = 0  # events other than claims and faults: work done, for the supervisor's restarts
        self.profiled: list[str] = []  # finalists in the order their profiles arrived
        self.bench_failures: set[str] = set()
        # (rung, a, b) -> the request and, once measured, its result
        self.adjudications: dict[tuple[int, str, str], AdjudicationRequested] = {}
        self.adjudicated: dict[tuple[int, str, str], Adjudicated] = {}
        self.finished: RunFinished | None = None
        self.decisions: list[tuple[int, Event]] = []
        self.gpu_s = 0.0
        self.tokens = 0
        self.timed_s = 0.0  # the spans its tasks held the device alone (BudgetCharged v2)
        self.timed_costs: dict[str, list[float]] = {}  # those spans per kind of task (cost_kind)
        self.event_count = 0
        self.wall_closed_s = 0.0  # wall time of earlier sessions (start/resume to their last event)
        self._session_start: float | None = None
        self.last_ts = 0.0
        self.started_ts = 0.0  # when RunStarted was recorded (wall clock)

    # --- folding -------------------------------------------------------------------------------

    def apply(self, event: StoredEvent) -> None:
        typed = decode(event)
        if event.type == "RunCopied":  # where the log came from (replay reads it): no work, no time
            self.position = event.seq
            return
        self.event_count += 1
        if event.type not in ("TaskClaimed", "LeaseExpired", "TaskFaulted"):
            self.progress += 1
        handler = getattr(self, f"_apply_{event.type}", None)
        if handler is not None:
            handler(typed, event)
            cid = getattr(typed, "candidate", None)
            if cid in self._live and self._live[cid].terminal is not None:
                del self._live[cid]
        self.last_ts = event.ts
        self.position = event.seq

    def _candidate(self, e: Event, raw: StoredEvent) -> Candidate:
        cid = e.candidate  # type: ignore[attr-defined]
        if cid not in self.candidates:
            raise EventError(
                f"event #{raw.seq} ({raw.type}) names candidate {cid}, never proposed in run "
                f"{self.run_id}: the log is damaged"
            )
        return self.candidates[cid]

    def _apply_RunStarted(self, e: RunStarted, raw: StoredEvent) -> None:
        self.started = e
        self.started_ts = raw.ts
        self._session_start = raw.ts

    def _apply_RunResumed(self, e: RunResumed, raw: StoredEvent) -> None:
        self.resumes.append(e)
        if self._session_start is not None:
            self.wall_closed_s += self.last_ts - self._session_start
        self._session_start = raw.ts

    def _apply_ProblemAnalysed(self, e: ProblemAnalysed, raw: StoredEvent) -> None:
        self.analysis = e

    def _apply_ProblemFailed(self, e: ProblemFailed, raw: StoredEvent) -> None:
        self.problem_failed = self.problem_failed or e

    @property
    def eval_mode(self) -> bool:
        """Whether the run's reference and candidates are built in eval mode whatever their constructor
        leaves them in: `kb run --eval`, or a run analysed before kb built them as constructed (its
        ProblemAnalysed records no mode), whose verdicts were all made in eval mode."""
        return self.config.eval_mode or (self.analysis is not None and self.analysis.mode is None)

    @property
    def problem_fault(self) -> str | None:
        """Why the problem itself cannot be evaluated (its analysis, or its code in a later stage)."""
        if self.analysis is not None and self.analysis.error:
            return self.analysis.error
        if self.problem_failed is not None:
            return self.problem_failed.error
        return None

    def _apply_CandidateProposed(self, e: CandidateProposed, raw: StoredEvent) -> None:
        c = Candidate(e, raw.seq, len(self.candidates), late=self.finished is not None)
        self.candidates[e.candidate] = c
        self._live[c.id] = c

    def _apply_GenerationDone(self, e: GenerationDone, raw: StoredEvent) -> None:
        self.generation[e.task] = e

    def _apply_GenerationFailed(self, e: GenerationFailed, raw: StoredEvent) -> None:
        self.generation_failed[e.task] = (e, self.session)

    def parked(self) -> list[GenerationFailed]:
        """Generation tasks whose service failed in this session: they wait for `kb resume`."""
        return [
            e
            for t, (e, session) in self.generation_failed.items()
            if session == self.session and t not in self.generation
        ]

    @property
    def session(self) -> int:
        """0 for the run's first session, n after its nth `kb resume`."""
        return len(self.resumes)

    def _apply_LeaseExpired(self, e: LeaseExpired, raw: StoredEvent) -> None:
        self.task_faults.setdefault(e.task, []).append((self.session, lease_lost(e.worker)))

    def _apply_TaskFaulted(self, e: TaskFaulted, raw: StoredEvent) -> None:
        self.task_faults.setdefault(e.task, []).append((self.session, e.error))

    def _apply_TaskParked(self, e: TaskParked, raw: StoredEvent) -> None:
        self.tasks_parked[e.task] = (e, self.session)

    def faults(self, task: str) -> list[str]:
        """Why the task's workers died or raised on it this session, oldest first."""
        return [line for session, line in self.task_faults.get(task, []) if session == self.session]

    def parked_tasks(self) -> list[TaskParked]:
        """Tasks set aside this session after repeated worker faults: they wait for `kb resume`."""
        return [e for e, session in self.tasks_parked.values() if session == self.session]

    def _parked(self, role: str) -> set[tuple[str, str | None, int | None, str | None]]:
        return {(e.kind, e.candidate, e.rung, e.rival) for e in self.parked_tasks() if e.role == role}

    def pending(self) -> bool:
        """Whether any role has a task left: generation, a gate, a rung, a profile or a duel."""
        return bool(
            self.generation_tasks()
            or self.gate_tasks()
            or self.bench_tasks()
            or self.profile_tasks()
            or self.adjudication_tasks()
        )

    def _apply_GatePassed(self, e: GatePassed, raw: StoredEvent) -> None:
        self._candidate(e, raw).gate = e

    def _apply_GateFailed(self, e: GateFailed, raw: StoredEvent) -> None:
        self._candidate(e, raw).gate = e

    def _apply_RungBenchmarked(self, e: RungBenchmarked, raw: StoredEvent) -> None:
        c = self._candidate(e, raw)
        if e.rung not in c.results:
            bisect.insort(self.ranking.setdefault(e.rung, []), (-e.score, c.id))
        c.results[e.rung] = e

    def _apply_BenchmarkFailed(self, e: BenchmarkFailed, raw: StoredEvent) -> None:
        self._candidate(e, raw).bench_failed = e
        self.bench_failures.add(e.candidate)

    def _apply_ProfileCaptured(self, e: ProfileCaptured, raw: StoredEvent) -> None:
        c = self._candidate(e, raw)
        if c.profile is None:
            self.profiled.append(c.id)
        c.profile = e

    def _apply_BudgetCharged(self, e: BudgetCharged, raw: StoredEvent) -> None:
        self.gpu_s += e.gpu_s
        self.tokens += e.tokens
        if e.alone_from is not None and e.alone_to is not None:
            span = max(0.0, e.alone_to - e.alone_from)
            self.timed_s += span
            self.timed_costs.setdefault(cost_kind(e.action), []).append(span)

    def _apply_Promoted(self, e: Promoted, raw: StoredEvent) -> None:
        self._candidate(e, raw).promotions[e.rung_from] = e
        self.decisions.append((raw.seq, e))

    def _apply_Pruned(self, e: Pruned, raw: StoredEvent) -> None:
        self._candidate(e, raw).pruned = e
        self.decisions.append((raw.seq, e))

    def _apply_AdjudicationRequested(self, e: AdjudicationRequested, raw: StoredEvent) -> None:
        self.adjudications[(e.rung, e.a, e.b)] = e
        self.decisions.append((raw.seq, e))

    def _apply_Adjudicated(self, e: Adjudicated, raw: StoredEvent) -> None:
        self.adjudicated[(e.rung, e.a, e.b)] = e

    def _apply_RunFinished(self, e: RunFinished, raw: StoredEvent) -> None:
        self.finished = e
        self.decisions.append((raw.seq, e))

    # --- derived views -------------------------------------------------------------------------

    @property
    def config(self) -> RunConfig:
        if self.started is None:
            raise RunNotStarted(f"run {self.run_id} has no RunStarted event")
        return self.started.config

    @property
    def top_rung(self) -> int:
        return len(self.config.rungs) - 1

    @property
    def wall_s(self) -> float:
        """Wall time the run has been live, summed over its sessions (a pure function of the log)."""
        current = self.last_ts - self._session_start if self._session_start is not None else 0.0
        return self.wall_closed_s + current

    def live(self) -> list[Candidate]:
        return list(self._live.values())

    # --- the device budget (policy v4: only what held the device alone counts) --------------------

    @property
    def device_s(self) -> float:
        """The device seconds the GPU budget counts: from policy v4 on, the spans the run's tasks held the
        device alone (timing, profiling: what they cost a shared pool, never their neighbours' share);
        before it, every child's busy time, gates and analyses included."""
        return self.timed_s if self.config.policy_version >= 4 else self.gpu_s

    def estimate(self, kind: str) -> float:
        """What a timed task of `kind` (cost_kind) will hold the device alone for: the most one of its kind
        took in this run; for a rung none reached yet, the rung below scaled by the samples and shapes
        it takes; 0 where nothing of it was seen (the first of its kind always starts)."""
        if seen := self.timed_costs.get(kind):
            return max(seen)
        what, _, rung = kind.partition("/")
        if what == "bench" and int(rung) > 0:
            below = int(rung) - 1
            return self.estimate(f"bench/{below}") * self._work(int(rung)) / self._work(below)
        if what == "duel":
            return 2 * self.estimate(f"bench/{rung}")  # both candidates, interleaved, at that rung's work
        return 0.0

    def _work(self, rung: int) -> float:
        spec = self.config.rungs[rung]
        shapes = len(self.analysis.rung_shapes or self.analysis.shapes) if self.analysis else 1
        return (spec.repeats + spec.warmup) * (max(1, shapes) if spec.shapes == "all" else 1)

    def affordable(self, *kinds: str) -> bool:
        """Whether the GPU budget left pays for a task of these kinds (its parts): always, without a GPU
        budget or before policy v4."""
        budget = self.config.budget_gpu_s
        if budget is None or self.config.policy_version < 4:
            return True
        return self.timed_s + sum(self.estimate(k) for k in kinds) <= budget

    def withheld(self) -> list[tuple[str, float]]:
        """The timed tasks the budget left cannot pay for, as (kind, estimate): they start in no role."""
        kinds = [f"bench/{r}" for _, r in self.bench_tasks(afford=False)]
        kinds += [f"duel/{a.rung}" for a in self.adjudication_tasks(afford=False)]
        kinds += ["profile" for _ in self.profile_tasks(afford=False)]
        return [(k, self.estimate(k)) for k in kinds if not self.affordable(k)]

    def gate_tasks(self) -> list[Candidate]:
        if self.problem_failed is not None:
            return []  # the problem's own code fails: no candidate can be judged
        parked = self._parked("gatekeeper")
        return [c for c in self.live() if c.gate is None and ("", c.id, None, None) not in parked]

    def bench_tasks(self, afford: bool = True) -> list[tuple[Candidate, int]]:
        """Rungs to measure (`afford`: only those the GPU budget left pays for)."""
        if self.problem_failed is not None:
            return []
        parked = self._parked("benchmarker")
        return [
            (c, r)
            for c in self.live()
            if c.bench_failed is None
            for r in c.admitted
            if r not in c.results
            and ("", c.id, r, None) not in parked
            and (not afford or self.affordable(f"bench/{r}"))
        ]

    def adjudication_tasks(self, afford: bool = True) -> list[AdjudicationRequested]:
        parked = self._parked("benchmarker")
        return [
            r
            for k, r in self.adjudications.items()
            if k not in self.adjudicated
            and ("", r.a, r.rung, r.b) not in parked
            and (not afford or self.affordable(f"duel/{r.rung}"))
        ]

    def profile_tasks(self, afford: bool = True) -> list[Candidate]:
        """Finalists to profile: every one measured at the top rung, or with --max-profiles the best of
        them while profiles are left (a sweep's one a problem)."""
        parked = self._parked("profiler")
        top = self.top_rung
        todo = [
            c
            for c in self.live()
            if top in c.results
            and c.profile is None
            and ("", c.id, top, None) not in parked
            and (not afford or self.affordable("profile", "profile/ncu"))
        ]
        if (most := self.config.max_profiles) is not None:
            todo = sorted(todo, key=lambda c: (-c.results[top].score, c.seq))[
                : max(0, most - len(self.profiled))
            ]
        return todo

    def generation_tasks(self) -> list[str]:
        """Generation tasks not yet done: round 0, then one mutation round per profiled finalist."""
        if self.problem_fault:
            return []
        if len(self.candidates) >= self.config.max_candidates and "round0" in self.generation:
            return []
        tasks = ["round0"]
        tasks += [f"mutate/{cid}" for cid in self.profiled]
        parked = {e.task for e in self.parked()} | {kind for kind, *_ in self._parked("generator")}
        return [t for t in tasks if t not in self.generation and t not in parked]

    def leader(self) -> Candidate | None:
        """Best candidate so far: highest rung reached, then best score there, then first proposed."""
        scored = [c for c in self.candidates.values() if c.results and c.bench_failed is None]
        if not scored:
            return None
        return min(scored, key=lambda c: (-max(c.results), -c.results[max(c.results)].score, c.seq))
