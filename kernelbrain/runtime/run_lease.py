"""The lease on a run: one process at a time drives a run (`kb run`, `kb resume`), so a second `kb resume`
of a live run is refused rather than doubling its workers.

It is the store's task lease (claim, renew, release; fencing tokens), named by the run id itself, so it
works alike on SQLite and PostgreSQL. Its holder renews it every KB_LEASE_TTL/3 seconds from a thread of
its own (worker.Heartbeat). A holder that died on this host (a SIGKILL) lets go at once, as a task's
lease does: its owner id names its pid and start time. One on another host lets go when its lease runs
out. The renewals are writes, so they are also how the supervisor learns that its database can no longer
be written (`probe`)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

from kernelbrain.core.errors import RunError
from kernelbrain.runtime.reconnect import retrying
from kernelbrain.runtime.role import owner_alive, owner_id
from kernelbrain.runtime.worker import LEASE_TTL_S, Heartbeat
from kernelbrain.store import Lease, StoreError, open_store


class RunHeld(RunError):
    """Another live process drives the run: it holds the run's lease."""


def lease_name(run_id: str) -> str:
    """The name of a run's lease among the store's task leases (tasks are named RUN/kind/...)."""
    return run_id


def holder(owner: str, ttl_s: float) -> str:
    """A lease owner id (`resume@host:pid:start`) as a person reads it; one on another host may have
    died unseen, so when its lease lapses is said too."""
    role, _, where = owner.partition("@")
    host, _, rest = where.partition(":")
    pid = rest.partition(":")[0]
    if not pid:
        return owner
    elsewhere = f"; if it died, its lease lapses within {ttl_s:g} s" if host != socket.gethostname() else ""
    return f"`kb {role}` (pid {pid} on {host}{elsewhere})"


class RunLease:
    """This process's lease on a run, or on each run of a batch: claimed on creation (RunHeld when a live
    process holds one of them), renewed in the background (one thread and one connection for them all),
    released by `release`."""

    def __init__(self, db: str, run_ids: str | list[str], role: str, ttl_s: float = LEASE_TTL_S) -> None:
        self.run_ids = [run_ids] if isinstance(run_ids, str) else list(run_ids)
        self.run_id = self.run_ids[0]
        self.ttl_s = ttl_s
        self.store = open_store(db, create=False)
        self.leases: list[Lease] = []
        try:
            for run_id in self.run_ids:
                self.leases.append(self._claim(run_id, role))
        except BaseException:
            for lease in self.leases:
                with contextlib.suppress(StoreError):
                    self.store.release(lease)
            self.store.close()
            raise
        self.beat = Heartbeat(db, self.leases, ttl_s)
        self.beat.start()

    def _claim(self, run_id: str, role: str) -> Lease:
        name = lease_name(run_id)
        claimed = retrying(
            lambda: self.store.claim(name, owner_id(role), self.ttl_s, is_alive=owner_alive), f"kb {role}"
        )
        if claimed is None:
            held = self.store.lease(name)
            by = holder(held.owner, self.ttl_s) if held is not None else "another process"
            raise RunHeld(
                f"run {run_id} is being driven already, by {by}; a second driver would run its "
                f"workers twice. Let that one finish, or stop it, then `kb resume {run_id}`"
            )
        return claimed

    def check(self) -> None:
        """Raise what stopped the renewals: RunHeld when another process took a lease (this one's
        renewals failed past its deadline), the StoreError the database gave."""
        if self.beat.lost is not None:
            raise RunHeld(
                f"run {self.run_id}: another process took its lease while this one could not renew it "
                f"({self.beat.lost}); this one stops, leaving the run to it"
            )
        if self.beat.failed is not None:
            raise self.beat.failed

    def probe(self) -> None:
        """Renew a lease now: a write, so a database that can no longer be written says so (StoreError)."""
        self.check()
        first = self.leases[0]
        self.leases[0] = retrying(lambda: self.store.renew(first, self.ttl_s), "kb")

    def release(self) -> None:
        """Stop renewing and let go, so that the next `kb resume` takes the runs at once."""
        self.beat.done.set()
        self.beat.join(timeout=10)
        for lease in self.beat.leases:
            with contextlib.suppress(StoreError):
                self.store.release(lease)
        with contextlib.suppress(StoreError):
            self.store.close()


@contextlib.contextmanager
def held(db: str, run_ids: str | list[str], role: str) -> Iterator[RunLease]:
    """The run's lease (each run's, for a batch) for the block (`role`: run or resume, as the refusal
    names its holder)."""
    lease = RunLease(db, run_ids, role)
    try:
        yield lease
    finally:
        lease.release()
