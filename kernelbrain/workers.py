"""The five workers. Each polls the log, folds it into RunState, claims a task, does it, and appends
its result fenced by the claim, so a worker killed at any moment loses at most its task in flight.

Idempotency keys are derived from a result's inputs (run, candidate, rung, role): a task executed twice
(a lease that expired under a slow worker) has one effect. The scheduler claims nothing: its decisions
are a pure function of the log and their keys make concurrent schedulers harmless.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from kernelbrain import generators
from kernelbrain.diagnosis import ncu_labels, roofline_labels
from kernelbrain.events import (
    Adjudicated,
    BenchmarkFailed,
    BudgetCharged,
    CandidateProposed,
    Event,
    GateFailed,
    GatePassed,
    GenerationDone,
    LeaseExpired,
    ProblemAnalysed,
    ProfileCaptured,
    RungBenchmarked,
    ShapeTiming,
    TaskClaimed,
)
from kernelbrain.generators.prompt import describe_numbers
from kernelbrain.sandbox import Sandbox, SandboxError, SandboxFault
from kernelbrain.scheduler import DUEL_PAIRS, adjudicate, policy_for, score
from kernelbrain.state import RunState
from kernelbrain.templates import FAMILIES
from store import EventStore, Lease, NewEvent, StaleLease

log = logging.getLogger("kernelbrain.worker")

ROLES = ("generator", "gatekeeper", "benchmarker", "profiler", "scheduler")
LEASE_TTL_S = float(os.environ.get("KB_LEASE_TTL", "30"))
POLL_S = float(os.environ.get("KB_POLL", "0.1"))


def _proc_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks
    except (OSError, IndexError):
        return None


def owner_id(role: str) -> str:
    pid = os.getpid()
    return f"{role}@{socket.gethostname()}:{pid}:{_proc_start(pid)}"


def owner_alive(owner: str) -> bool:
    """A lease held by a dead process on this host can be taken before its deadline."""
    try:
        host, pid, start = owner.rsplit("@", 1)[1].rsplit(":", 2)
    except ValueError:
        return True
    if host != socket.gethostname():
        return True  # cannot tell: wait for the deadline
    return _proc_start(int(pid)) == start


@dataclass(frozen=True)
class Task:
    key: str  # lease name and idempotency-key prefix
    candidate: str | None = None
    rung: int | None = None
    kind: str = ""


class Role(abc.ABC):
    name: str
    uses_sandbox = False
    # its child makes the CUDA context before its first task (the generator's analysis needs none)
    warms_cuda = True

    def __init__(self, store: EventStore, gpu: int | None = None) -> None:
        self.store = store
        self.gpu = gpu
        self.sandboxes: dict[str, Sandbox] = {}
        self.actor = owner_id(self.name)

    def wants_warm(self, state: RunState) -> bool:
        """Whether a child is worth starting ahead of a first task (a torch import, a CUDA context)."""
        return self.uses_sandbox

    def sandbox(self, device: str) -> Sandbox:
        if device not in self.sandboxes:
            self.sandboxes[device] = Sandbox(device, gpu=self.gpu, warm_cuda=self.warms_cuda)
        return self.sandboxes[device]

    def close(self) -> None:
        for sb in self.sandboxes.values():
            sb.close()

    @abc.abstractmethod
    def tasks(self, state: RunState) -> list[Task]: ...

    @abc.abstractmethod
    def execute(self, task: Task, state: RunState) -> list[NewEvent]: ...

    # helpers shared by the roles
    def new(self, state: RunState, event: Event, key: str, task: Task | None = None) -> NewEvent:
        return event.to_new(
            state.run_id,
            key,
            self.actor,
            subject=task.candidate if task else None,
            stage=task.rung if task else None,
        )

    def charge(
        self, state: RunState, task: Task, *, gpu_s: float = 0.0, wall_s: float = 0.0, tokens: int = 0
    ) -> NewEvent:
        return self.new(
            state,
            BudgetCharged(action=task.key, role=self.name, gpu_s=gpu_s, wall_s=wall_s, tokens=tokens),
            f"{task.key}/budget",
            task,
        )

    def problem_source(self, state: RunState) -> str:
        assert state.started
        return self.store.get_blob(state.started.problem_hash).decode()

    def candidate_source(self, state: RunState, cid: str) -> str:
        return self.store.get_blob(state.candidates[cid].proposal.source).decode()


class GeneratorRole(Role):
    name = "generator"
    uses_sandbox = True
    warms_cuda = False  # the analysis traces on the meta device, and it is the first task of a run

    def tasks(self, state: RunState) -> list[Task]:
        return [Task(f"{state.run_id}/gen/{t}", kind=t) for t in state.generation_tasks()]

    def wants_warm(self, state: RunState) -> bool:
        return state.analysis is None  # the analysis is this role's only use of a child

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        cfg = state.config
        t0 = time.perf_counter()
        out: list[NewEvent] = []
        busy = 0.0
        analysis = state.analysis
        if analysis is None:
            try:
                result, busy = self.sandbox(cfg.device).call(
                    "analyse",
                    {"problem_source": self.problem_source(state), "device": cfg.device},
                    timeout_s=cfg.gate_timeout_s,
                    task=task.key,
                )
                analysis = ProblemAnalysed(**result, families=[])
                if analysis.traced_on == "meta":  # shapes only: the GPU was not used
                    busy = 0.0
            except (SandboxFault, SandboxError) as e:
                analysis = ProblemAnalysed(
                    ops=[], families=[], flops=0, bytes=0, shapes=[], error=str(e).splitlines()[0]
                )
            # the template families that match, for the record
            families = [f.FAMILY for f in FAMILIES if f.matches(analysis.ops) is not None]
            analysis = analysis.model_copy(update={"families": families})
            out.append(self.new(state, analysis, f"{state.run_id}/analysis"))
        parent = None
        note = ""
        proposals: list[generators.Proposal] = []
        tokens = 0
        if not analysis.error:
            try:
                gen = generators.get(cfg.generator, **cfg.generator_options())
                source = self.problem_source(state)
                if task.kind == "round0":
                    proposals = gen.first_round(analysis, problem_source=source)
                else:
                    parent = state.candidates[task.kind.split("/", 1)[1]]
                    proposals = gen.mutate(
                        analysis,
                        parent.proposal.knobs,
                        parent.proposal.family,
                        parent.profile.labels if parent.profile else [],
                        problem_source=source,
                        parent_source=self.candidate_source(state, parent.id),
                        numbers=describe_numbers(parent.results, parent.profile),
                    )
                tokens = sum(d.tokens for d in gen.discarded)  # replies that gave nothing still cost tokens
                if not proposals and gen.discarded:
                    note = "; ".join(f"{d.hint}: {d.reason}" for d in gen.discarded[:3])
            except generators.GenerationError as e:
                note = str(e)
        slots = cfg.max_candidates - len(state.candidates)
        proposed, duplicates = [], 0
        round_no = 0 if parent is None else parent.proposal.round + 1
        for p in proposals:
            tokens += p.tokens
            source_hash = self.store.put_blob(p.source)
            cid = source_hash[:16]
            if cid in state.candidates or cid in proposed:
                duplicates += 1
                continue
            if len(proposed) >= slots:
                break
            proposed.append(cid)
            event = CandidateProposed(
                candidate=cid,
                source=source_hash,
                parent=parent.id if parent else None,
                generator=gen.name,
                family=p.family,
                strategy=p.strategy,
                knobs=p.knobs,
                round=round_no,
                hint=p.hint,
                diagnosis=p.diagnosis,
                prompt=self.store.put_blob(p.prompt) if p.prompt else None,
                reply=self.store.put_blob(p.reply) if p.reply else None,
            )
            out.append(event.to_new(state.run_id, f"{state.run_id}/propose/{cid}", self.actor, subject=cid))
        out.append(
            self.new(
                state,
                GenerationDone(task=task.kind, proposed=proposed, duplicates=duplicates, note=note),
                f"{task.key}/done",
            )
        )
        out.append(self.charge(state, task, gpu_s=busy, wall_s=time.perf_counter() - t0, tokens=tokens))
        return out


class CandidateRole(Role):
    """A role that runs one sandbox op on one candidate and records its outcome or its fault."""

    uses_sandbox = True
    op: str

    def args(self, task: Task, state: RunState) -> dict[str, Any]:
        return {}

    def timeout_s(self, state: RunState) -> float:
        return state.config.bench_timeout_s

    @abc.abstractmethod
    def on_result(self, task: Task, result: dict) -> Event: ...

    @abc.abstractmethod
    def on_fault(self, task: Task, category: str, detail: str) -> Event: ...

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        device = state.config.device
        t0 = time.perf_counter()
        busy = 0.0
        args = {
            "problem_source": self.problem_source(state),
            "cand_source": self.candidate_source(state, task.candidate),
            "device": device,
            **self.args(task, state),
        }
        try:
            result, busy = self.sandbox(device).call(
                self.op, args, timeout_s=self.timeout_s(state), task=task.key
            )
            event = self.on_result(task, result)
        except SandboxFault as f:
            event = self.on_fault(task, f.category, f.detail)
        except SandboxError as e:  # kb's own failure in the child: recorded, so the run moves on
            event = self.on_fault(task, "runtime", str(e).splitlines()[0])
        wall = time.perf_counter() - t0
        return [
            self.new(state, event, task.key, task),
            self.charge(state, task, gpu_s=busy or wall, wall_s=wall),
        ]


class GatekeeperRole(CandidateRole):
    name = "gatekeeper"
    op = "gate"

    def tasks(self, state: RunState) -> list[Task]:
        return [Task(f"{state.run_id}/gate/{c.id}", c.id) for c in state.gate_tasks()]

    def args(self, task: Task, state: RunState) -> dict[str, Any]:
        return {"seeds": state.config.gate_seeds}

    def timeout_s(self, state: RunState) -> float:
        return state.config.gate_timeout_s

    def on_result(self, task: Task, r: dict) -> Event:
        if r["passed"]:
            return GatePassed(
                candidate=task.candidate,
                seeds=r["seeds"],
                max_abs_err=r["max_abs_err"],
                max_rel_err=r["max_rel_err"],
                tolerance=r["tolerance"],
            )
        return GateFailed(
            candidate=task.candidate,
            category=r["category"],
            detail=r["detail"],
            max_abs_err=r.get("max_abs_err"),
            max_rel_err=r.get("max_rel_err"),
        )

    def on_fault(self, task: Task, category: str, detail: str) -> Event:
        return GateFailed(candidate=task.candidate, category=category, detail=detail)


class BenchmarkerRole(CandidateRole):
    name = "benchmarker"
    op = "bench"

    def tasks(self, state: RunState) -> list[Task]:
        # adjudications first, then the highest rung: those are what the scheduler's decisions wait on
        duels = [
            Task(f"{state.run_id}/adjudicate/{r.rung}/{r.a}/{r.b}", r.a, r.rung, kind=r.b)
            for r in state.adjudication_tasks()
        ]
        todo = sorted(state.bench_tasks(), key=lambda cr: (-cr[1], cr[0].seq))
        return duels + [Task(f"{state.run_id}/bench/{c.id}/{r}", c.id, r) for c, r in todo]

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        if not task.kind:
            return super().execute(task, state)
        rung = state.config.rungs[task.rung]
        a, b = task.candidate, task.kind
        t0 = time.perf_counter()
        args = {
            "problem_source": self.problem_source(state),
            "a_source": self.candidate_source(state, a),
            "b_source": self.candidate_source(state, b),
            "device": state.config.device,
            "which": rung.shapes,
            "repeats": max(DUEL_PAIRS, 2 * rung.repeats),
            "warmup": rung.warmup,
        }
        busy = 0.0
        try:
            r, busy = self.sandbox(state.config.device).call(
                "duel", args, timeout_s=self.timeout_s(state), task=task.key
            )
            outcome, med, q1, q3 = adjudicate(r["ratios"])
            timer = r["timer"]
            pairs = len(r["ratios"])
        except (SandboxFault, SandboxError):
            # the pair cannot be re-measured (each ran alone before): do not rank them on noise
            outcome, med, q1, q3, timer, pairs = "tie", 1.0, 1.0, 1.0, "failed", 0
        event = Adjudicated(
            rung=task.rung,
            a=a,
            b=b,
            pairs=pairs,
            ratio_median=med,
            ratio_q1=q1,
            ratio_q3=q3,
            outcome=outcome,
            timer=timer,
        )
        wall = time.perf_counter() - t0
        return [
            self.new(state, event, task.key, task),
            self.charge(state, task, gpu_s=busy or wall, wall_s=wall),
        ]

    def args(self, task: Task, state: RunState) -> dict[str, Any]:
        rung = state.config.rungs[task.rung]
        return {"which": rung.shapes, "repeats": rung.repeats, "warmup": rung.warmup}

    def on_result(self, task: Task, r: dict) -> Event:
        shapes = [ShapeTiming(**s) for s in r["shapes"]]
        return RungBenchmarked(
            candidate=task.candidate, rung=task.rung, shapes=shapes, score=score(shapes), timer=r["timer"]
        )

    def on_fault(self, task: Task, category: str, detail: str) -> Event:
        return BenchmarkFailed(candidate=task.candidate, rung=task.rung, category=category, detail=detail)


class ProfilerRole(CandidateRole):
    """Nsight Compute where it can read the counters; the analytical roofline always, and in its place
    where ncu is absent or refuses (recorded as such)."""

    name = "profiler"
    op = "roofline"

    def tasks(self, state: RunState) -> list[Task]:
        return [Task(f"{state.run_id}/profile/{c.id}", c.id, state.top_rung) for c in state.profile_tasks()]

    def args(self, task: Task, state: RunState) -> dict[str, Any]:
        a = state.analysis  # counted at the primary shape, where the roofline times the candidate
        return {"flops": a.flops, "nbytes": a.bytes} if a is not None and a.error is None else {}

    def on_result(self, task: Task, metrics: dict) -> Event:
        return ProfileCaptured(
            candidate=task.candidate, source="roofline", metrics=metrics, labels=roofline_labels(metrics)
        )

    def on_fault(self, task: Task, category: str, detail: str) -> Event:
        return ProfileCaptured(
            candidate=task.candidate,
            source="roofline",
            metrics={},
            labels=[f"profile failed ({category}): {detail}"],
        )

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        events = super().execute(task, state)  # the roofline, and its charge
        if state.config.device != "cuda":
            return events
        roof = ProfileCaptured.model_validate(events[0].payload)
        t0 = time.perf_counter()
        args = {
            "problem_source": self.problem_source(state),
            "cand_source": self.candidate_source(state, task.candidate),
            "device": "cuda",
        }
        busy = 0.0
        try:
            r, busy = self.sandbox("cuda").call(
                "ncu", args, timeout_s=self.timeout_s(state), task=f"{task.key}/ncu"
            )
        except (SandboxFault, SandboxError) as e:
            r = {"error": str(e).splitlines()[0]}
        if "error" in r:
            profile = roof.model_copy(update={"note": f"ncu not used: {r['error']}"})
        else:
            metrics = {**r["metrics"], **{f"roofline_{k}": v for k, v in roof.metrics.items()}}
            profile = ProfileCaptured(
                candidate=task.candidate,
                source="ncu",
                metrics=metrics,
                labels=ncu_labels(r["metrics"]),
                report=self.store.put_blob(r["raw"]),
            )
        wall = time.perf_counter() - t0
        return [
            self.new(state, profile, task.key, task),
            events[1],
            self.charge(
                state, Task(f"{task.key}/ncu", task.candidate, task.rung), gpu_s=busy or wall, wall_s=wall
            ),
        ]


class SchedulerRole(Role):
    name = "scheduler"

    def tasks(self, state: RunState) -> list[Task]:
        return []

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        return []

    def decide(self, state: RunState) -> bool:
        decisions = policy_for(state.config.policy_version).decide(state)
        if not decisions:
            return False
        self.store.append(
            [self.new(state, d, decision_key(state.run_id, d)) for d in decisions],
            tracking=(f"scheduler/{state.run_id}", state.position),
        )
        return True


def decision_key(run_id: str, d: Event) -> str:
    cand = getattr(d, "candidate", None)
    if d.TYPE == "Promoted":
        return f"{run_id}/promote/{cand}/{d.rung_from}"  # type: ignore[attr-defined]
    if d.TYPE == "Pruned":
        return f"{run_id}/prune/{cand}"
    if d.TYPE == "AdjudicationRequested":
        return f"{run_id}/adjudication-requested/{d.rung}/{d.a}/{d.b}"  # type: ignore[attr-defined]
    return f"{run_id}/finished"


ROLE_CLASSES: dict[str, type[Role]] = {
    r.name: r for r in (GeneratorRole, GatekeeperRole, BenchmarkerRole, ProfilerRole, SchedulerRole)
}


class _Heartbeat(threading.Thread):
    """Renews a lease from its own connection while the task runs, so a slow task keeps its claim."""

    def __init__(self, db: str, lease: Lease, ttl_s: float) -> None:
        super().__init__(daemon=True)
        self.db, self.lease, self.ttl_s = db, lease, ttl_s
        self.done = threading.Event()

    def run(self) -> None:
        store = EventStore(self.db, create=False)
        try:
            while not self.done.wait(self.ttl_s / 3):
                try:
                    self.lease = store.renew(self.lease, self.ttl_s)
                except StaleLease:
                    return
        finally:
            store.close()


class Worker:
    """One role's polling loop over one run (or every unfinished run when run_id is None)."""

    def __init__(
        self,
        db: str,
        role: str,
        run_id: str | None = None,
        *,
        gpu: int | None = None,
        ttl_s: float = LEASE_TTL_S,
    ) -> None:
        self.db = db
        self.store = EventStore(db, create=False)
        self.role = ROLE_CLASSES[role](self.store, gpu)
        self.run_id = run_id
        self.ttl_s = ttl_s
        self.states: dict[str, RunState] = {}
        self.stopping = False
        self.warmed = False

    def warm(self, state: RunState) -> None:
        """Start the sandbox child now: its torch import overlaps the other workers' first tasks (not
        when the role will not need one: a resumed run's generator, its analysis recorded)."""
        if not self.warmed and self.role.wants_warm(state):
            self.role.sandbox(state.config.device).start()
        self.warmed = True

    def refresh(self) -> list[RunState]:
        ids = [self.run_id] if self.run_id else self.store.run_ids()
        for rid in ids:
            state = self.states.setdefault(rid, RunState(rid))
            self.store.fold(state, run_id=rid)
        return [self.states[rid] for rid in ids if self.states[rid].finished is None]

    def step(self) -> bool:
        """Do at most one unit of work on each live run; True when something was done."""
        did = False
        for state in self.refresh():
            if state.started is None or self.stopping:
                continue
            self.warm(state)
            if isinstance(self.role, SchedulerRole):
                did |= self.role.decide(state)
                continue
            for task in self.role.tasks(state):
                if self._attempt(task, state):
                    did = True
                    break
        return did

    def _attempt(self, task: Task, state: RunState) -> bool:
        def record(new: Lease, previous: Lease | None) -> list[NewEvent]:
            events = []
            if previous is not None and previous.token != new.token:
                events.append(
                    self.role.new(
                        state,
                        LeaseExpired(
                            task=task.key,
                            worker=previous.owner,
                            token=previous.token,
                            deadline=previous.deadline,
                            taken_by=new.owner,
                        ),
                        f"{task.key}/expired/{previous.token}",
                        task,
                    )
                )
            events.append(
                self.role.new(
                    state,
                    TaskClaimed(task=task.key, worker=new.owner, token=new.token, deadline=new.deadline),
                    f"{task.key}/claim/{new.token}",
                    task,
                )
            )
            return events

        lease = self.store.claim(task.key, self.role.actor, self.ttl_s, on_claim=record, is_alive=owner_alive)
        if lease is None:
            return False
        beat = _Heartbeat(self.db, lease, self.ttl_s)
        beat.start()
        try:
            events = self.role.execute(task, state)
        except BaseException:
            beat.done.set()
            with contextlib.suppress(Exception):
                self.store.release(lease)
            raise
        beat.done.set()
        beat.join()
        try:
            self.store.append(events, fence=lease, complete=True)
        except StaleLease:
            log.warning("%s: lease on %s was taken over; result dropped", self.role.actor, task.key)
        return True

    def install_signal_handlers(self) -> None:
        def stop(signum: int, frame: Any) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    def run(self, idle_exit_s: float | None = None) -> None:
        """Poll until stopped, or (with a run id) until that run has finished."""
        idle_since = time.monotonic()
        try:
            while not self.stopping:
                if self.step():
                    idle_since = time.monotonic()
                    continue
                if self.run_id and self.states.get(self.run_id) and self.states[self.run_id].finished:
                    return
                if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                    return
                time.sleep(POLL_S)
        finally:
            self.close()

    def close(self) -> None:
        self.role.close()
        self.store.close()
