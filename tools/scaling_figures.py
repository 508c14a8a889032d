"""tools/scaling_bench.py's figures: the result's models and what one run's event log says (throughput,
busy per GPU, claim and decision latency, efficiency)."""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; appended, so an installed kb comes first
    sys.path.append(str(ROOT))

from kernelbrain.store import Store, StoredEvent, mask, open_store  # noqa: E402

from kernelbrain.core.events import (  # noqa: E402
    DECISION_TYPES,
    BudgetCharged,
    RungBenchmarked,
    TaskClaimed,
    decode,
)
from kernelbrain.core.state import RunState  # noqa: E402
from kernelbrain.runtime.roles import ROLE_CLASSES  # noqa: E402

TASK_ROLES = ("generator", "gatekeeper", "benchmarker", "profiler")
NO_NEW_TASKS = {"TaskClaimed", "BudgetCharged", "LeaseExpired"}


# --- the result's models -----------------------------------------------------------------------------


class Spread(BaseModel):
    """A latency's distribution, in seconds (None where there was none)."""

    n: int
    median_s: float | None
    p90_s: float | None
    max_s: float | None


class RoleLoad(BaseModel):
    """One role's tasks on one GPU; held = claim to result = busy + waiting + bookkeeping."""

    tasks: int
    held_s: float  # TaskClaimed to its BudgetCharged
    busy_s: float  # the sandboxed children's own busy seconds (BudgetCharged.gpu_s)
    waiting_s: float  # the consultation's wall minus busy: the GPU lock, a child's start, the round trip
    bookkeeping_s: float  # held minus the consultation's wall: reading blobs, appending the result


class GpuLoad(BaseModel):
    gpu: int
    busy_share: float  # busy seconds of every role placed on it, over the run's wall (roles may overlap)
    bench_busy_share: float  # the benchmarker's alone
    roles: dict[str, RoleLoad]
    smi_utilisation: float | None = None  # nvidia-smi's mean utilization.gpu (0-1) over the run; CUDA only


class Worker(BaseModel):
    role: str
    gpu: int | None
    pid: int


class RunFigures(BaseModel):
    n: int
    db: str  # masked
    run_id: str
    exit_code: int  # of `kb run` (0: a winner; 3: none)
    workers: list[Worker]
    wall_s: float  # RunStarted to RunFinished: also the wall time to the winner
    candidates: list[str]  # in proposal order: the candidate stream
    gated: int  # GatePassed + GateFailed
    gate_passed: int
    rungs: int  # RungBenchmarked
    bench_failed: int
    gate_per_min: float
    rungs_per_min: float
    gate_per_min_steady: float | None  # between the first and the last gate result (no start-up)
    rungs_per_min_steady: float | None
    gpus: list[GpuLoad]
    winner: str | None
    winner_rung: int | None
    winner_score: float | None
    winner_measured_s: float | None  # RunStarted to the winner's result at its winning rung
    decision_latency: Spread
    claim_latency: dict[str, Spread]  # per role: available to claimed (queueing included)
    # per role: claimed minus the later of available and the claiming worker's previous result (its first
    # claim left out: that includes its start-up): the orchestration's own share of a claim
    claim_overhead: dict[str, Spread]
    unclaimed: int  # tasks a role listed that nobody claimed before the run finished
    bench_backlog_share: float  # share of the wall with some rung task waiting for a benchmarker
    compile_s: float  # Triton compile seconds of the rungs (ShapeTiming.compile_s)
    replay_agrees: bool
    efficiency_gate: float | None = None  # gate_per_min / (n x gate_per_min at N=1)
    efficiency_rungs: float | None = None


class Sampled(BaseModel):
    samples_s: list[float]  # the candidate's median per sample
    median_s: float
    iqr_s: float
    within_rel_iqr: float  # median over samples of the rung's own relative IQR (its repeats' spread)


class NoiseShape(BaseModel):
    shape: str
    idle: Sampled
    busy: Sampled
    shift: float  # busy median / idle median - 1
    noise: float  # the larger of: each condition's IQR across samples over its median, the rung's own
    moved: bool  # |shift| > noise


class NoiseResult(BaseModel):
    run_id: str
    candidate: str
    rung: int
    gpu: int
    loaded_gpus: list[int]
    repeats: int
    shapes: list[NoiseShape] = []
    error: str | None = None


class ScalingResult(BaseModel):
    dry_run: bool
    label: str
    device: str
    problem: str
    seed: int
    max_candidates: int
    ladder: str | None
    command: str
    host: str
    targets: str
    runs: list[RunFigures]
    same_winner: bool
    same_stream: bool
    noise: NoiseResult | None = None


# --- running one N -----------------------------------------------------------------------------------


# --- reading one run's log ---------------------------------------------------------------------------


def spread(values: list[float]) -> Spread:
    if not values:
        return Spread(n=0, median_s=None, p90_s=None, max_s=None)
    v = sorted(values)
    p90 = v[min(len(v) - 1, round(0.9 * (len(v) - 1)))]
    return Spread(n=len(v), median_s=statistics.median(v), p90_s=p90, max_s=v[-1])


def per_min(count: int, seconds: float) -> float:
    return count / seconds * 60 if seconds > 0 else 0.0


def steady(times: list[float]) -> float | None:
    """Results per minute between the first and the last of them (the start-up left out)."""
    return per_min(len(times) - 1, max(times) - min(times)) if len(times) >= 2 else None


def covered(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of the intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def owner_key(actor: str) -> tuple[str, int] | None:
    """(role, pid) of a worker's owner id `role@host:pid:start`."""
    try:
        role, rest = actor.split("@", 1)
        return role, int(rest.rsplit(":", 2)[1])
    except (ValueError, IndexError):
        return None


def availability(store: Store, events: list[StoredEvent], run_id: str) -> tuple[RunState, dict[str, tuple]]:
    """The run folded event by event; per task key, (role, time) of the event after which that role's own
    task list first named it."""
    state = RunState(run_id)
    roles = {name: ROLE_CLASSES[name](store) for name in TASK_ROLES}
    first: dict[str, tuple[str, float]] = {}
    for raw in events:
        state.apply(raw)
        if raw.type in NO_NEW_TASKS or state.started is None or state.finished is not None:
            continue
        for name, role in roles.items():
            for task in role.tasks(state):
                first.setdefault(task.key, (name, raw.ts))
    return state, first


def role_load(done: list[tuple[float, float, float, float]]) -> RoleLoad:
    held, busy, waiting, books = (sum(col) for col in zip(*done, strict=True))
    return RoleLoad(tasks=len(done), held_s=held, busy_s=busy, waiting_s=waiting, bookkeeping_s=books)


def analyse(db: str, run_id: str, n: int, code: int, workers: list[Worker], util: dict) -> RunFigures:
    from kernelbrain.views.replay import replay

    with open_store(db, create=False, readonly=True) as store:
        events = store.read(run_id=run_id)
        state, available = availability(store, events, run_id)
        agrees = replay(store, run_id).agrees
    assert state.started is not None and state.finished is not None, f"run {run_id} did not finish"
    t0 = events[0].ts
    wall = next(e.ts for e in events if e.type == "RunFinished") - t0
    ts_of = {e.seq: e.ts for e in events}
    gpu_of = {(w.role, w.pid): w.gpu for w in workers}

    claims: dict[str, list[tuple[float, str]]] = defaultdict(list)
    # per GPU and role, per task: (held, busy, waiting, bookkeeping) seconds
    tasks: dict[int, dict[str, list[tuple[float, float, float, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    decisions, compile_s = [], 0.0
    gate_ts, rung_ts = [], []
    last_done: dict[str, float] = {}  # per worker, when it appended its last result
    overhead: dict[str, list[float]] = defaultdict(list)
    for raw in events:
        if raw.type == "TaskClaimed":
            claim = decode(raw)
            assert isinstance(claim, TaskClaimed)
            claims[claim.task].append((raw.ts, claim.worker))
            if claim.task in available and claim.worker in last_done:
                role, at = available[claim.task]
                overhead[role].append(raw.ts - max(at, last_done[claim.worker]))
        elif raw.type == "BudgetCharged":
            charge = decode(raw)
            assert isinstance(charge, BudgetCharged)
            last_done[raw.actor] = raw.ts
            key = owner_key(raw.actor)
            gpu = gpu_of.get(key) if key else None
            held = [ts for ts, w in claims.get(charge.action, []) if w == raw.actor and ts <= raw.ts]
            if gpu is not None and held:  # the last claim of that task by that worker
                h = raw.ts - held[-1]
                b = charge.gpu_s
                tasks[gpu][charge.role].append((h, b, charge.wall_s - b, h - charge.wall_s))
        elif raw.type in ("GatePassed", "GateFailed"):
            gate_ts.append(raw.ts)
        elif raw.type == "RungBenchmarked":
            rung_ts.append(raw.ts)
            bench = decode(raw)
            assert isinstance(bench, RungBenchmarked)
            compile_s += sum(s.compile_s for s in bench.shapes)
        if raw.type in DECISION_TYPES and raw.payload.get("basis") in ts_of:
            decisions.append(raw.ts - ts_of[raw.payload["basis"]])

    latency: dict[str, list[float]] = defaultdict(list)
    backlog, unclaimed = [], 0
    for task, (role, at) in available.items():
        if task not in claims:
            unclaimed += 1
            continue
        latency[role].append(claims[task][0][0] - at)
        if role == "benchmarker":
            backlog.append((at, claims[task][0][0]))

    gpus = []
    for g in range(n):
        roles = {role: role_load(done) for role, done in sorted(tasks[g].items())}
        bench = roles["benchmarker"].busy_s if "benchmarker" in roles else 0.0
        gpus.append(
            GpuLoad(
                gpu=g,
                busy_share=sum(r.busy_s for r in roles.values()) / wall,
                bench_busy_share=bench / wall,
                roles=roles,
                smi_utilisation=util.get(g),
            )
        )
    fin = state.finished
    won_at = None
    if fin.winner is not None and fin.winner_rung is not None:
        won_at = next(
            (
                e.ts - t0
                for e in events
                if e.type == "RungBenchmarked" and e.subject == fin.winner and e.stage == fin.winner_rung
            ),
            None,
        )
    candidates = sorted(state.candidates.values(), key=lambda c: c.seq)
    return RunFigures(
        n=n,
        db=mask(db),
        run_id=run_id,
        exit_code=code,
        workers=workers,
        wall_s=wall,
        candidates=[c.id for c in candidates],
        gated=len(gate_ts),
        gate_passed=sum(1 for e in events if e.type == "GatePassed"),
        rungs=len(rung_ts),
        bench_failed=sum(1 for e in events if e.type == "BenchmarkFailed"),
        gate_per_min=per_min(len(gate_ts), wall),
        rungs_per_min=per_min(len(rung_ts), wall),
        gate_per_min_steady=steady(gate_ts),
        rungs_per_min_steady=steady(rung_ts),
        gpus=gpus,
        winner=fin.winner,
        winner_rung=fin.winner_rung,
        winner_score=fin.winner_score,
        winner_measured_s=won_at,
        decision_latency=spread(decisions),
        claim_latency={role: spread(v) for role, v in sorted(latency.items())},
        claim_overhead={role: spread(v) for role, v in sorted(overhead.items())},
        unclaimed=unclaimed,
        bench_backlog_share=covered(backlog) / wall,
        compile_s=compile_s,
        replay_agrees=agrees,
    )


def with_efficiency(runs: list[RunFigures]) -> list[RunFigures]:
    """Each run's throughput over N times the N=1 run's (None without an N=1 run or a zero there)."""
    one = next((r for r in runs if r.n == 1), None)

    def eff(mine: float, base: float | None, n: int) -> float | None:
        return mine / (n * base) if base else None

    return [
        r.model_copy(
            update={
                "efficiency_gate": eff(r.gate_per_min, one.gate_per_min if one else None, r.n),
                "efficiency_rungs": eff(r.rungs_per_min, one.rungs_per_min if one else None, r.n),
            }
        )
        for r in runs
    ]
