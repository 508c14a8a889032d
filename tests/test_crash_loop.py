"""Crashes at chosen points of a run never lose or duplicate work.

20 SIGKILLs of a whole process group, each aimed at a point in the run's event log rather than at a
wall-clock moment: the test watches the database (read-only, polling) and kills as soon as the chosen
event (or the Nth of a kind) is recorded, so the kills cover every phase a CPU run goes through (start,
round-0 analysis, gate, each rung of the benchmark ladder, promotion, profile) whatever the machine's
load. Five runs, one a lane (each lane its own test and database, so that pytest-xdist runs them side
by side): each `kb run` is killed at one target, then each of three `kb resume`s that continue it at a
later one, and a last `kb resume` finishes it. Each kill asserts that its target was reached in that
process and that the kill interrupted the run there (the run not finished, but for the kill aimed at the
first profile, which can be the run's last work; for a claimed task, that task still in flight), so a
target the run never reaches fails the test instead of passing it. Then: single workers SIGKILLed in
the middle of a task; SIGTERM and SIGINT stopping a run that then resumes. After each: every candidate
terminal, one effect per identity, no completed benchmark executed again (the sandbox children log every
execution), and `kb replay` agrees with the log.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import pytest
from kernelbrain.store import EventStore, StoredEvent

from kernelbrain.core.events import EVENT_TYPES, decode
from kernelbrain.core.state import RunState
from tests.invariants import check_run, read_exec_log
from tests.kbcli import SOFTMAX, kb, kb_env, kb_start

LANES = 5
POLL_S = 0.01  # how often the watcher reads the log (~2% of a core): a kill lands ~10 ms after its target


@dataclass(frozen=True)
class KillAt:
    """Kill as soon as the `nth` event of `types` (a claim of a `kind` task; at `rung`) is in the log.

    Claims count distinct tasks (a task claimed again after a kill counts once). Unless `may_finish`, the
    kill must land before RunFinished. `in_flight`: the target is a claim, and the kill must land before
    that task's result is recorded. `before`: no event of that type may follow the target.
    """

    phase: str
    types: tuple[str, ...]
    nth: int = 1
    kind: str | None = None  # TaskClaimed: the task's kind (gen, gate, bench, profile)
    rung: int | None = None  # TaskClaimed of a bench task, RungBenchmarked: its rung; Promoted: rung_from
    in_flight: bool = False
    before: str | None = None
    may_finish: bool = False

    def matches(self, raw: StoredEvent) -> bool:
        if raw.type not in self.types:
            return False
        if self.kind is not None and decode(raw).task.split("/")[1] != self.kind:  # run/kind/...
            return False
        if self.rung is None:
            return True
        return (decode(raw).rung_from if raw.type == "Promoted" else raw.stage) == self.rung


VERDICT = ("GatePassed", "GateFailed")
CLAIM = ("TaskClaimed",)
MEASURED = ("RungBenchmarked",)
# A CPU run of softmax_small with 4 candidates records, in order: RunStarted; the round-0 claim, and
# ~5 s later ProblemAnalysed + CandidateProposed x4 + GenerationDone in one transaction; gate claims and
# verdicts; bench claims and RungBenchmarked at rungs 0, 1, 2 with Promoted between (at least one
# candidate climbs each rung: ASHA keeps at least the best); a profile claim and ProfileCaptured per
# candidate at the top rung; then Pruned... + RunFinished in one transaction. Every target but the first
# profile has work after it in every such run, so the kill must interrupt the run there; the first
# profile can be the run's last work (one finalist): that kill lands just before the scheduler records
# the finish (it polls every KB_POLL = 50 ms), or just after it while kb shuts down.
# Each lane: the kill in `kb run`, then one in each of three `kb resume`s that continue it. Every target
# is strictly later than the one before it by at least one whole task of the run, never by a scheduler
# poll alone, so the resumed process reaches it: the gates and the benchmarks run one at a time (one
# gatekeeper, one benchmarker), a promotion from rung 0 needs 3 rung-0 measurements, one from rung 1
# needs every rung-0 measurement, and a profile a candidate measured at the top rung. With 4 candidates
# that all pass the gate, the bench tasks are 4 at rung 0, 1 at rung 1 and 1 at rung 2. Were a target
# ever reached before the process aimed at it began, its kill fails (`_aim`), never passes.
LANES_OF_KILLS = [
    (
        KillAt("started, before any claim", ("RunStarted",), before="TaskClaimed"),
        KillAt("gating the second candidate", CLAIM, nth=2, kind="gate", in_flight=True),
        KillAt("measuring rung 1", CLAIM, kind="bench", rung=1, in_flight=True),
        KillAt("after the promotion to the top rung", ("Promoted",), rung=1),
    ),
    (
        KillAt("analysing round 0", CLAIM, kind="gen", in_flight=True),
        KillAt("measuring rung 0", CLAIM, kind="bench", rung=0, in_flight=True),
        KillAt("measuring the fourth bench task", CLAIM, nth=4, kind="bench", in_flight=True),
        KillAt("measuring the top rung", CLAIM, kind="bench", rung=2, in_flight=True),
    ),
    (
        KillAt("round 0 proposed, nothing gated", ("GenerationDone",)),
        KillAt("after the first rung-0 measurement", MEASURED, rung=0),
        KillAt("after the fourth measurement", MEASURED, nth=4),
        KillAt("after the first top-rung measurement", MEASURED, rung=2),
    ),
    (
        KillAt("gating the first candidate", CLAIM, kind="gate", in_flight=True),
        KillAt("after the first promotion", ("Promoted",)),
        KillAt("after the first rung-1 measurement", MEASURED, rung=1),
        KillAt("profiling a finalist", CLAIM, kind="profile", in_flight=True),
    ),
    (
        KillAt("after the first gate verdict", VERDICT),
        KillAt("after every gate verdict", VERDICT, nth=4),
        KillAt("measuring the sixth bench task", CLAIM, nth=6, kind="bench", in_flight=True),
        KillAt("after the first profile, around the finish", ("ProfileCaptured",), may_finish=True),
    ),
]
TARGETS = [k for lane in LANES_OF_KILLS for k in lane]
# Event types no kill is aimed at, and why. Every other type a lane's runs record must be some target's.
UNTARGETED = {
    "ProblemAnalysed": "recorded in round 0's transaction, with the proposals and GenerationDone",
    "CandidateProposed": "recorded in round 0's transaction, with the analysis and GenerationDone",
    "BudgetCharged": "recorded in the transaction of the result it pays for",
    "Pruned": "recorded with RunFinished (or with the decision that stops the candidate)",
    "RunFinished": "the end: nothing left to interrupt",
    "RunResumed": "recorded by `kb resume` before its workers start; its kill is aimed at a later event",
    "LeaseExpired": "recorded by a resumed worker, in the transaction of its claim",
    "AdjudicationRequested": "only when two candidates fall within noise: not every run has one",
    "Adjudicated": "only when two candidates fall within noise: not every run has one",
}


@dataclass
class Kill:
    phase: str
    process: str  # "run" or "resume"
    target_seq: int  # the event the kill was aimed at
    lag_ms: float  # from its commit to the SIGKILL
    events: int  # events of the run recorded by the moment the process group was dead
    last: str  # the type of the last of them
    finished: bool
    in_flight: list[str]  # claimed tasks without a result at the kill: "kind:rung"


def _aim(db, run_id: str, proc, target: KillAt, since: int, timeout: float = 240.0) -> StoredEvent:
    """Poll the log (read-only) until `target` is recorded; the event that met it, which must be one
    this process recorded (after event #`since`)."""
    seen: set[str] = set()
    n, after = 0, 0
    deadline = time.monotonic() + timeout
    with EventStore(db, create=False, readonly=True) as store:
        while True:
            exited = proc.poll()  # before the read: an exit seen here recorded all it ever will
            for raw in store.read(after, run_id=run_id):
                after = raw.seq
                if not target.matches(raw):
                    continue
                if raw.type == "TaskClaimed":
                    task = decode(raw).task
                    if task in seen:
                        continue  # claimed again after a kill: the same task
                    seen.add(task)
                n += 1
                if n == target.nth:
                    assert raw.seq > since, (
                        f"kill target {target.phase!r} was reached (#{raw.seq}) before this process began"
                        f" (#{since})"
                    )
                    return raw
            if exited is not None:
                raise AssertionError(
                    f"kill target {target.phase!r} never reached: kb exited ({exited}) after {n} of"
                    f" {target.nth} matching events; stderr: {proc.stderr.read()[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"kill target {target.phase!r} not reached within {timeout} s")
            time.sleep(POLL_S)


def _kill_at(db, run_id: str, proc, target: KillAt, since: int, process: str) -> Kill:
    hit = _aim(db, run_id, proc, target, since)
    os.killpg(proc.pid, signal.SIGKILL)
    lag_ms = (time.time() - hit.ts) * 1000
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, (
        f"{target.phase}: kb {process} exited ({proc.returncode}) before the kill landed"
    )
    with EventStore(db, create=False, readonly=True) as store:
        events = store.read(run_id=run_id)
        finished = [e for e in events if e.type == "RunFinished"]
        claims = [decode(e) for e in events if e.type == "TaskClaimed"]
        open_tasks = {c.task for c in claims if not store.is_done(c.task)}
    if not target.may_finish:
        assert not finished, f"kill aimed at {target.phase!r} landed after the run finished"
    if target.before is not None:
        after = [e.type for e in events if e.seq > hit.seq]
        assert target.before not in after, f"kill aimed at {target.phase!r} landed after {after}"
    if target.in_flight:
        task = decode(hit).task
        assert task in open_tasks, (
            f"kill aimed at {target.phase!r} landed after {task} was done; the log then ended with "
            f"{[e.type for e in events if e.seq > hit.seq]}"
        )
    return Kill(
        phase=target.phase,
        process=process,
        target_seq=hit.seq,
        lag_ms=lag_ms,
        events=len(events),
        last=events[-1].type,
        finished=bool(finished),
        in_flight=sorted(":".join(t.split("/")[1:4:2]) for t in open_tasks),
    )


def _finish(db, run_id, env) -> None:
    """Resume the run to its end. In this process: the kills are what the test aims at supervised
    workers, and the finish only has to complete what they left (two sandboxed children, not six)."""
    r = kb("resume", run_id, "--db", str(db), "--quiet", "--inprocess", env=env)
    if r.returncode != 0:
        assert "already finished" in r.stderr, r.stderr
    else:
        assert f"run {run_id} finished" in r.stdout


def test_kill_targets_are_known_event_types():
    """A renamed event type must fail here, not as a target that silently stopped matching."""
    aimed = {t for k in TARGETS for t in k.types}
    assert aimed | set(UNTARGETED) <= set(EVENT_TYPES), (aimed | set(UNTARGETED)) - set(EVENT_TYPES)
    assert not aimed & set(UNTARGETED)
    assert len(TARGETS) == 20 and len({k.phase for k in TARGETS}) == 20


@pytest.mark.long
@pytest.mark.parametrize("lane", range(LANES))
def test_kill_the_whole_run_at_chosen_events_then_resume(tmp_path, lane):
    db, log = tmp_path / "kb.db", tmp_path / "exec.log"
    env = kb_env(KB_EXEC_LOG=str(log))
    first, *later = LANES_OF_KILLS[lane]
    args = ["--max-candidates", "4", "--seed", str(lane), "--device", "cpu", "--quiet"]
    proc, run_id = kb_start(["run", str(SOFTMAX), "--db", str(db), *args], env)
    kills = [_kill_at(db, run_id, proc, first, 0, "run")]
    for target in later:
        with EventStore(db, create=False, readonly=True) as store:
            since = store.last_seq(run_id)
        proc, resumed = kb_start(["resume", run_id, "--db", str(db), "--quiet"], env)
        assert resumed == run_id
        kills.append(_kill_at(db, run_id, proc, target, since, "resume"))
    _finish(db, run_id, env)
    check_run(db, run_id, log)
    for k in kills:  # the evidence, shown by pytest -rP
        print(
            f"kb {k.process:6} {k.phase:43} target #{k.target_seq:<3} +{k.lag_ms:3.0f} ms:"
            f" {k.events:>2} events, last {k.last:15} in flight {k.in_flight}"
            f"{' (after RunFinished)' if k.finished else ''}"
        )
    with EventStore(db, create=False, readonly=True) as store:
        recorded = {e.type for e in store.read(run_id=run_id)}
        assert store.run_ids() == [run_id]
    aimed = {t for k in TARGETS for t in k.types}
    assert recorded - aimed <= set(UNTARGETED), (
        f"the run recorded event types no kill is aimed at: {sorted(recorded - aimed - set(UNTARGETED))}"
    )


def _wait_for_claim(db, run_id, kind: str, timeout: float = 60.0):
    """The first claim of a task of this kind whose result is not in the log yet."""
    deadline = time.monotonic() + timeout
    with EventStore(db, create=False, readonly=True) as store:
        while time.monotonic() < deadline:
            events = store.read(run_id=run_id)
            done = {e.key for e in events}
            for raw in events:
                if raw.type == "TaskClaimed":
                    claim = decode(raw)
                    if f"/{kind}/" in claim.task and claim.task not in done:
                        return claim
            time.sleep(0.02)
    raise AssertionError(f"no {kind} task was claimed within {timeout} s")


@pytest.mark.long
@pytest.mark.parametrize("kind", ["gate", "bench", "profile"])
def test_kill_one_worker_mid_task(tmp_path, kind):
    db, log = tmp_path / "kb.db", tmp_path / "exec.log"
    env = kb_env(KB_EXEC_LOG=str(log))
    proc, run_id = kb_start(
        ["run", str(SOFTMAX), "--db", str(db), "--max-candidates", "4", "--device", "cpu", "--quiet"], env
    )
    claim = _wait_for_claim(db, run_id, kind)
    pid = int(claim.worker.split("@")[1].split(":")[1])
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "worker exited with -9; restarting it" in err
    state = check_run(db, run_id, log)
    with EventStore(db, create=False) as store:
        expired = [decode(e) for e in store.read(run_id=run_id, types=["LeaseExpired"])]
        results = [e for e in store.read(run_id=run_id) if e.key == claim.task]
    assert [(e.task, e.worker) for e in expired] == [(claim.task, claim.worker)]
    assert expired[0].taken_by != claim.worker
    assert len(results) == 1, "the task killed in flight was done again exactly once"
    assert state.finished is not None


@pytest.mark.long
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_leaves_a_resumable_run(tmp_path, sig):
    db, log = tmp_path / "kb.db", tmp_path / "exec.log"
    env = kb_env(KB_EXEC_LOG=str(log))
    proc, run_id = kb_start(
        ["run", str(SOFTMAX), "--db", str(db), "--max-candidates", "4", "--device", "cpu", "--quiet"], env
    )
    _wait_for_claim(db, run_id, "bench")
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # what Ctrl-C in a terminal does: the whole foreground group
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert f"kb resume {run_id}" in err
    with EventStore(db, create=False) as store:
        state = store.fold(RunState(run_id), run_id=run_id)
    assert state.finished is None
    bench_done = {e for _, e, op in read_exec_log(log) if op == "bench"}
    _finish(db, run_id, env)
    check_run(db, run_id, log)
    assert bench_done, "the run was stopped before it measured anything"


def test_ctrl_c_stops_an_inprocess_run_resumably(tmp_path):
    """--inprocess steps the workers in kb's own process: Ctrl-C there must end like the supervised run
    (the task in flight finished and recorded, exit 130, `kb resume` named), not as an abort mid-task."""
    db, log = tmp_path / "kb.db", tmp_path / "exec.log"
    env = kb_env(KB_EXEC_LOG=str(log))
    args = ["--db", str(db), "--quiet", "--inprocess"]
    one = ["--max-candidates", "1", "--device", "cpu", "--ladder", "smallest:1:0"]  # quick: one rung
    proc, run_id = kb_start(["run", str(SOFTMAX), *one, *args], env)
    claim = _wait_for_claim(db, run_id, "gate")
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        f"kb: run {run_id} interrupted; everything recorded is kept. Continue with: kb resume {run_id}"
    )
    with EventStore(db, create=False) as store:
        state = store.fold(RunState(run_id), run_id=run_id)
        assert store.is_done(claim.task), "the gate task in flight was abandoned, not finished"
    assert state.finished is None
    r = kb("resume", run_id, *args, env=env)
    assert r.returncode == 0, r.stderr
    assert f"run {run_id} finished" in r.stdout
    check_run(db, run_id, log)
