"""The worker loop. Each worker polls the log, folds it into RunState, claims its role's task, does it,
and appends its result fenced by the claim, so a worker killed at any moment loses at most its task in
flight.

Idempotency keys are derived from a result's inputs (run, candidate, rung, role): a task executed twice
(a lease that expired under a slow worker) has one effect. The scheduler claims nothing: its decisions
are a pure function of the log and their keys make concurrent schedulers harmless.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

from kernelbrain.core.events import LeaseExpired, TaskClaimed, TaskFaulted, TaskParked
from kernelbrain.core.state import RunState, lease_lost
from kernelbrain.runtime.role import Task, owner_alive
from kernelbrain.runtime.roles import ROLE_CLASSES, SchedulerRole
from kernelbrain.store import Lease, NewEvent, StaleLease, open_store

log = logging.getLogger("kernelbrain.worker")

LEASE_TTL_S = float(os.environ.get("KB_LEASE_TTL", "30"))
POLL_S = float(os.environ.get("KB_POLL", "0.1"))
# a task its workers died or raised on this many times in a session is parked, so the rest of the run
# goes on (and a role's restarts are not spent on one task); `kb resume` tries it again
MAX_TASK_FAULTS = 3


class Heartbeat(threading.Thread):
    """Renews a lease from its own connection while the task runs, so a slow task keeps its claim."""

    def __init__(self, db: str, lease: Lease, ttl_s: float) -> None:
        super().__init__(daemon=True)
        self.db, self.lease, self.ttl_s = db, lease, ttl_s
        self.done = threading.Event()

    def run(self) -> None:
        store = open_store(self.db, create=False)
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
        self.store = open_store(db, create=False)
        self.role = ROLE_CLASSES[role](self.store, gpu)
        self.run_id = run_id
        self.ttl_s = ttl_s
        self.states: dict[str, RunState] = {}
        self.stopping = False
        self.warmed = False
        self.in_task = False

    def warm(self, state: RunState) -> None:
        """Start the sandbox child ahead of the role's first task, once the role says the run will need
        it: its torch import overlaps the other workers' work (a resumed run's generator, its analysis
        recorded, never needs one)."""
        if not self.warmed and self.role.wants_warm(state):
            self.role.warm(state.config.device)
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
        took_over: list[str] = []  # the holder whose lease this claim took, if it took one

        def record(new: Lease, previous: Lease | None) -> list[NewEvent]:
            events = []
            took_over.clear()
            # a lease its holder released (deadline 0: it raised and said so, or parked the task) did not
            # expire under it
            if previous is not None and previous.token != new.token and previous.deadline > 0:
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
        beat = Heartbeat(self.db, lease, self.ttl_s)
        beat.start()
        self.warmed = True  # the task starts the child it needs
        self.in_task = True
        try:
            events = self.role.execute(task, state)
        except BaseException as e:
            self.in_task = False
            beat.done.set()
            if isinstance(e, Exception):  # kb's own fault: said in the log before the worker dies
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
        try:
            self.store.append(events, fence=lease, complete=True)
        except StaleLease:
            log.warning("%s: lease on %s was taken over; result dropped", self.role.actor, task.key)
        return True

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

    def install_signal_handlers(self) -> None:
        def stop(signum: int, frame: Any) -> None:
            self.stopping = True
            if self.in_task and self.role.abandons_on_stop:
                os._exit(128 + signum)  # nothing of the task is recorded; it is done again on resume

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
