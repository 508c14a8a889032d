"""The worker loop. Each worker folds the log into RunState, claims its role's task, does it, and appends
its result fenced by the claim, so a worker killed at any moment loses at most its task in flight. With
nothing to do it waits for the next event (woken by the store: NOTIFY on PostgreSQL), looking again
after KB_POLL seconds at most (a lease may expire with no event).

A worker that loses its database (StoreUnavailable) retries with backoff (runtime/reconnect.py): its
loop, its lease's heartbeat, and the fenced append of a finished task's result, which the fence refuses
if the lease expired meanwhile and another worker took the task.

Idempotency keys are derived from a result's inputs (run, candidate, rung, role): a task executed twice
(a lease that expired under a slow worker) has one effect. The scheduler claims nothing: its decisions
are a pure function of the log and their keys make concurrent schedulers harmless.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from kernelbrain.core.events import LeaseExpired, TaskClaimed, TaskFaulted, TaskParked
from kernelbrain.core.state import RunState, lease_lost
from kernelbrain.runtime.batch import batch_runs
from kernelbrain.runtime.faults import DeviceBusy
from kernelbrain.runtime.reconnect import OUTAGE, retrying
from kernelbrain.runtime.role import Task, owner_alive
from kernelbrain.runtime.roles import ROLE_CLASSES, SchedulerRole
from kernelbrain.runtime.sandbox import Sandbox
from kernelbrain.store import (
    Lease,
    NewEvent,
    Projection,
    StaleLease,
    Store,
    StoredEvent,
    StoreError,
    StoreUnavailable,
    open_store,
)

log = logging.getLogger("kernelbrain.worker")

LEASE_TTL_S = float(os.environ.get("KB_LEASE_TTL", "30"))
POLL_S = float(os.environ.get("KB_POLL", "0.1"))
# where the store wakes a waiting worker on every append (PostgreSQL's NOTIFY), it looks again this often
# at the least, for what no event announces (an expired lease, the wall-clock budget)
WOKEN_RECHECK_S = 1.0
# a task its workers died or raised on this many times in a session is parked, so the rest of the run
# goes on (and a role's restarts are not spent on one task); `kb resume` tries it again
MAX_TASK_FAULTS = 3
# a task that ran out of device memory under load (DeviceBusy) is let go after this long (doubled each
# time), so its next try finds the device's other holders gone
BUSY_PAUSE_S = 2.0


class Heartbeat(threading.Thread):
    """Renews leases (a task's; the runs of a batch) from its own connection while the task runs, so a
    slow task keeps its claim; while the database is unreachable it keeps trying (a lease may run out
    meanwhile: the fence then refuses the task's result). It stops when another owner took a lease
    (`lost`) or the database refused a renewal (`failed`: it cannot be written)."""

    def __init__(self, db: str, leases: list[Lease], ttl_s: float) -> None:
        super().__init__(daemon=True)
        self.db, self.leases, self.ttl_s = db, leases, ttl_s
        self.done = threading.Event()
        self.lost: StaleLease | None = None
        self.failed: StoreError | None = None

    def run(self) -> None:
        store: Store | None = None  # opened at the first renewal: a short task needs no connection
        try:
            while not self.done.wait(self.ttl_s / 3):
                try:
                    store = store or open_store(self.db, create=False)
                    for i, lease in enumerate(self.leases):
                        self.leases[i] = store.renew(lease, self.ttl_s)
                    OUTAGE.ended()
                except StaleLease as e:
                    self.lost = e
                    return
                except StoreUnavailable as e:
                    OUTAGE.began(e)  # said once a process, with the line that it is back
                except StoreError as e:
                    self.failed = e
                    return
        finally:
            if store is not None:
                with contextlib.suppress(StoreError):
                    store.close()


class Loop:
    """What a worker process runs: steps until stopped, or (with a run id or a batch) until the runs it
    serves have finished; through a lost database (retried with backoff for KB_DB_RETRY_S, then
    StoreUnavailable is raised)."""

    store: Store
    stopping: bool

    @property
    def actor(self) -> str:
        """Who this loop is, in lines about a lost database."""
        raise NotImplementedError

    def step(self) -> bool:
        raise NotImplementedError

    def finished(self) -> bool:
        """Whether the run or the batch this loop serves has finished (one serving every run never has)."""
        raise NotImplementedError

    def abandons(self) -> bool:
        """Whether a stop signal now ends the process at once (a task in flight its role abandons)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def install_signal_handlers(self) -> None:
        def stop(signum: int, frame: Any) -> None:
            self.stopping = True
            if self.abandons():
                os._exit(128 + signum)  # nothing of the task is recorded; it is done again on resume

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    def run(self, idle_exit_s: float | None = None) -> None:
        idle_since = time.monotonic()
        recheck_s = max(POLL_S, WOKEN_RECHECK_S) if self.store.WAKES_WAITERS else POLL_S
        try:
            while not self.stopping:
                seen, did = retrying(self._look, self.actor)
                if did:
                    idle_since = time.monotonic()
                    continue
                if self.finished():
                    return
                if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                    return
                if not self.stopping:  # an event appended since `seen` (even during the step) wakes it
                    retrying(functools.partial(self.store.wait_for_events, seen, recheck_s), self.actor)
        finally:
            self.close()

    def _look(self) -> tuple[int, bool]:
        """The log's end before this step, and whether the step did anything."""
        seen = self.store.last_seq()
        return seen, self.step()


class Router(Projection):
    """A projection of the whole log that hands each event to its run's RunState: the states of many runs
    folded by one read. `runs`: the runs to keep (a batch's); None: every run, a state made at its
    first event."""

    def __init__(self, states: dict[str, RunState], runs: set[str] | None) -> None:
        super().__init__()
        self.states, self.runs = states, runs

    def apply(self, event: StoredEvent) -> None:
        if self.runs is not None and event.run_id not in self.runs:
            return
        state = self.states.get(event.run_id)
        if state is None:
            state = self.states[event.run_id] = RunState(event.run_id)
        if event.seq > state.position:
            state.apply(event)


class Worker(Loop):
    """One role's polling loop over one run, the runs of one batch, or every unfinished run."""

    def __init__(
        self,
        db: str,
        role: str,
        run_id: str | None = None,
        *,
        batch: str | None = None,
        gpu: int | None = None,
        ttl_s: float = LEASE_TTL_S,
        children: dict[str, Sandbox] | None = None,
    ) -> None:
        """`children`: sandboxes shared with the other workers of this process (role.py)."""
        self.db = db
        self.store = open_store(db, create=False)
        self.role = ROLE_CLASSES[role](self.store, gpu, children)
        self.run_id = run_id
        self.batch = batch
        self.batch_ids: list[str] = []  # the batch's runs, read once (they are started before its pool)
        self.ttl_s = ttl_s
        self.states: dict[str, RunState] = {}
        self.router = Router(self.states, None if batch is None else set())
        self.stopping = False
        self.warmed = False
        self.in_task = False
        self.last: str | None = None  # the run of the last task this worker did

    def warm(self, state: RunState) -> None:
        """Start the sandbox child ahead of the role's first task, once the role says the run will need
        it: its torch import overlaps the other workers' work (a resumed run's generator, its analysis
        recorded, never needs one)."""
        if not self.warmed and self.role.wants_warm(state):
            self.role.warm(state.config.device)
            self.warmed = True

    def refresh(self) -> list[RunState]:
        """Fold what the log gained into the states of the runs served: one query for them all (a pool's
        worker serves a batch of a hundred runs, ten times a second)."""
        if self.run_id:
            ids = [self.run_id]
            self.store.fold(self.states.setdefault(self.run_id, RunState(self.run_id)), run_id=self.run_id)
        else:
            if self.batch is not None and not self.batch_ids:
                self.batch_ids = batch_runs(self.store, self.batch)
                self.router.runs = set(self.batch_ids)
            if self.batch is None or self.batch_ids:  # (a batch not found yet: no event goes by unread)
                self.store.fold(self.router)
            ids = self.batch_ids if self.batch is not None else list(self.states)
        live = [self.states.get(rid) for rid in ids]
        return [s for s in live if s is not None and s.finished is None]

    def step(self, wait: bool = True) -> bool:
        """Do one unit of work: the first task that can be claimed of the live runs in `ordered`'s order
        (the run this worker served last, then the furthest along); True when one was done. A run whose
        tasks the device's memory cannot take now waits its turn: the others' go first, and only where
        none went (and `wait`: no other role of the process had work either) does the worker wait for
        room on one (device_room.fits_now). The scheduler decides on every live run."""
        live = [s for s in self.refresh() if s.started is not None]
        if self.stopping:
            return False
        if isinstance(self.role, SchedulerRole):
            did = False
            for state in live:
                self.warm(state)
                did |= self.role.decide(state)
            return did
        later: list[tuple[list[Task], RunState]] = []
        for state in self.ordered(live):
            if self.stopping:
                return False
            self.warm(state)
            tasks = self.role.tasks(state)
            if tasks and not self.role.fits_now(state):
                later.append((tasks, state))
            elif self._first(tasks, state):
                return True
        for tasks, state in later:
            if not wait or self.stopping:
                break
            if self._first(tasks, state):
                return True
        return False

    def _first(self, tasks: list[Task], state: RunState) -> bool:
        """The first of a run's tasks this worker could claim, done; whether one was."""
        if any(self._attempt(task, state) for task in tasks):
            self.last = state.run_id
            return True
        return False

    def ordered(self, live: list[RunState]) -> list[RunState]:
        """The order a batch's runs are served in: the run this worker did its last task for first (a
        gatekeeper's judge keeps that problem's draws: one drawn anew for each gate cost the H100 sweep a
        redraw per gate), then the runs furthest along (the highest rung measured, then the most
        candidates gated), then the batch's order. Every worker of a pool so works on the runs nearest
        their end, which end and free the device, instead of a hundred runs a step at a time (session 32's
        sweep: 12 of 104 files ended in 17 minutes, two thirds of the timed work spent on runs that did
        not)."""
        where = {rid: i for i, rid in enumerate(self.batch_ids)}

        def key(s: RunState) -> tuple[bool, int, int, int]:
            measured = [max(c.results) for c in s.candidates.values() if c.results]
            gated = sum(c.gate is not None for c in s.candidates.values())
            return (s.run_id != self.last, -max(measured, default=-1), -gated, where.get(s.run_id, 0))

        return sorted(live, key=key)

    def _attempt(self, task: Task, state: RunState) -> bool:
        took_over: list[str] = []  # the holder whose lease this claim took, if it took one

        def record(new: Lease, previous: Lease | None) -> list[NewEvent]:
            events = []
            took_over.clear()
            # a lease its holder released (deadline 0: it raised and said so, or parked the task) did not
            # expire under it; nor did one this worker takes again (its task was cut off by a lost database)
            if (
                previous is not None
                and previous.token != new.token
                and previous.deadline > 0
                and previous.owner != new.owner
            ):
                took_over.append(previous.owner)
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
        faults = state.faults(task.key)
        faults += [lease_lost(owner) for owner in took_over]  # recorded with the claim, not yet folded
        if len(faults) >= MAX_TASK_FAULTS:
            self._park(task, state, lease, faults)
            return True
        beat = Heartbeat(self.db, [lease], self.ttl_s)
        beat.start()
        self.warmed = True  # the task starts the child it needs
        self.in_task = True
        try:
            events = self.role.execute(task, state)
        except DeviceBusy as e:  # the pool's memory, not the task's: said, let go, tried again later
            self.in_task = False
            beat.done.set()
            self._busy(task, state, lease, e)
            return True
        except BaseException as e:
            self.in_task = False
            beat.done.set()
            # kb's own fault: said in the log before the worker dies (a lost database is no fault of the
            # task's: the loop takes it again once the database is back)
            if isinstance(e, Exception) and not isinstance(e, StoreUnavailable):
                line = (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0]
                fault = TaskFaulted(task=task.key, worker=self.role.actor, error=line)
                with contextlib.suppress(Exception):
                    self.store.append(
                        [self.role.new(state, fault, f"{task.key}/fault/{lease.token}", task)], fence=lease
                    )
            with contextlib.suppress(Exception):
                self.store.release(lease)
            raise
        self.in_task = False
        beat.done.set()
        beat.join()
        try:  # the result waits out a lost database; the fence refuses it if the lease ran out meanwhile
            retrying(
                lambda: self.store.append(events, fence=lease, complete=True), f"{self.role.actor} result"
            )
        except StaleLease:
            log.warning("%s: lease on %s was taken over; result dropped", self.role.actor, task.key)
        return True

    def _busy(self, task: Task, state: RunState, lease: Lease, e: DeviceBusy) -> None:
        """Record the out-of-memory fault of the pool's making as the task's (kb's fault, so the task is
        parked after MAX_TASK_FAULTS like any other) and release it after a pause, while the device's
        other holders let go."""
        fault = TaskFaulted(task=task.key, worker=self.role.actor, error=f"DeviceBusy: {e}")
        log.warning(
            "%s: %s ran out of device memory under load; trying it again: %s", self.role.actor, task.key, e
        )
        with contextlib.suppress(StaleLease):
            self.store.append(
                [self.role.new(state, fault, f"{task.key}/fault/{lease.token}", task)], fence=lease
            )
        time.sleep(min(BUSY_PAUSE_S * 2 ** len(state.faults(task.key)), 30.0))
        self.store.release(lease)

    def _park(self, task: Task, state: RunState, lease: Lease, faults: list[str]) -> None:
        """Set the task aside for this session, its lease released for the next `kb resume`."""
        parked = TaskParked(
            task=task.key,
            role=self.role.name,
            kind=task.kind,
            candidate=task.candidate,
            rung=task.rung,
            rival=task.rival,
            faults=len(faults),
            error=faults[-1],
        )
        log.warning("%s: parking %s after %d faults: %s", self.role.actor, task.key, len(faults), faults[-1])
        event = self.role.new(state, parked, f"{task.key}/parked/{state.session}", task)
        with contextlib.suppress(StaleLease):
            self.store.append([event], fence=lease)
        self.store.release(lease)

    @property
    def actor(self) -> str:
        return self.role.actor

    def serves(self) -> list[str]:
        """The runs this worker serves: its run's, its batch's; none named where it serves them all."""
        return [self.run_id] if self.run_id else self.batch_ids

    def finished(self) -> bool:
        ids = self.serves()
        return bool(ids) and all(rid in self.states and self.states[rid].finished is not None for rid in ids)

    def abandons(self) -> bool:
        return self.in_task and self.role.abandons_on_stop

    def close(self) -> None:
        self.role.close()
        self.store.close()


class Crew(Loop):
    """Several roles stepped in turn by one process, sharing one candidate child and one judge (role.py)
    rather than a pair a role: what `kb run` starts on a CPU device (roles.worker_processes), where the
    interpreter, not a GPU, is the work, and each child's torch import is most of a small run's CPU;
    and what `--inprocess` steps."""

    def __init__(
        self,
        db: str,
        roles: tuple[str, ...],
        run_id: str | None = None,
        *,
        batch: str | None = None,
        gpu: int | None = None,
    ):
        self.children: dict[str, Sandbox] = {}
        self.members = [
            Worker(db, role, run_id, batch=batch, gpu=gpu, children=self.children) for role in roles
        ]
        self.store = self.members[0].store

    @property
    def stopping(self) -> bool:
        return any(w.stopping for w in self.members)

    @stopping.setter
    def stopping(self, value: bool) -> None:
        for w in self.members:
            w.stopping = value

    @property
    def actor(self) -> str:
        return "/".join(w.role.name for w in self.members) + " worker"

    def step(self, halted: Callable[[], bool] = lambda: False) -> bool:
        """Each role's step in turn; none after a stop (`halted`: a stop this crew's owner was told of).
        A role waits for the device's memory only where no role had anything else to do."""
        did = False
        for wait in (False, True):
            for w in self.members:
                if w.stopping or halted():  # the step in flight has finished; start no other
                    return did
                did |= w.step(wait)
                if did and wait:
                    return did
            if did:
                return did
        return did

    def finished(self) -> bool:
        return all(w.finished() for w in self.members)

    def abandons(self) -> bool:
        return any(w.abandons() for w in self.members)

    def close(self) -> None:
        for w in self.members:
            w.close()
        for box in self.children.values():
            box.close()
