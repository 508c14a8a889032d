"""What every store adapter shares: the public contract (Store), and the row <-> record conversions,
idempotent-batch bookkeeping, fence verdicts and fold loop that SQLite and PostgreSQL both use."""

from __future__ import annotations

import abc
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import orjson
from kernelbrain.store.errors import StaleLease, StoreError
from kernelbrain.store.projection import Projection
from kernelbrain.store.records import Lease, NewEvent, StoredEvent

P = TypeVar("P", bound=Projection)
S = TypeVar("S", bound="Store")
T = TypeVar("T")
A = ParamSpec("A")

# Column order == StoredEvent field order, so a row maps onto the record positionally.
COLUMNS = "seq, run_id, type, version, key, payload, actor, subject, stage, ts"
# The order of insert_rows' parameters (payload at 6, ts at 8).
INSERT_COLUMNS = "run_id, type, version, subject, stage, key, payload, actor, ts"

_loads = orjson.loads


def read_sql(until: bool, run: bool, types: bool, *, mark: str, types_clause: str) -> str:
    """The SELECT behind read() and fold(): parameters after, [until], [run_id], [types], limit."""
    where = [f"seq > {mark}"]
    if until:
        where.append(f"seq <= {mark}")
    if run:
        where.append(f"run_id = {mark}")
    if types:  # one bound array keeps the statement text (and its prepared plan) fixed
        where.append(types_clause)
    return f"SELECT {COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY seq LIMIT {mark}"


def count_sql(run: bool, type_: bool, *, mark: str) -> str:
    where = [c for c, on in ((f"run_id = {mark}", run), (f"type = {mark}", type_)) if on]
    return "SELECT count(*) FROM events" + (f" WHERE {' AND '.join(where)}" if where else "")


def boundary(
    driver_error: type[BaseException],
) -> Callable[[Callable[Concatenate[S, A], T]], Callable[Concatenate[S, A], T]]:
    """A decorator for a store's public methods: no `driver_error` leaves one; it becomes the store's
    StoreError (store.translate_error), chained with `from`."""

    def decorate(fn: Callable[Concatenate[S, A], T]) -> Callable[Concatenate[S, A], T]:
        @functools.wraps(fn)
        def wrapper(store: S, /, *args: A.args, **kwargs: A.kwargs) -> T:
            try:
                return fn(store, *args, **kwargs)
            except driver_error as e:
                raise store.translate_error(e) from e

        return wrapper

    return decorate


def insert_rows(events: Sequence[NewEvent], ts: float | Sequence[float]) -> list[tuple[Any, ...]]:
    """Parameter rows in INSERT_COLUMNS order, at time ts (one for all, or one per event: a copied log
    keeps its own); encoding here, before any transaction, keeps a bad payload (TypeError) off the write
    lock."""
    dumps = orjson.dumps
    times = [ts] * len(events) if isinstance(ts, int | float) else list(ts)
    if len(times) != len(events):
        raise ValueError(f"{len(times)} times for {len(events)} events")
    return [
        (e.run_id, e.type, e.version, e.subject, e.stage, e.key, dumps(e.payload), e.actor, at)
        for e, at in zip(events, times, strict=True)
    ]


def event_from_row(row: Sequence[Any]) -> StoredEvent:
    """A StoredEvent from a row in COLUMNS order (payload as orjson bytes)."""
    seq, run_id, type_, version, key, payload, actor, subject, stage, ts = row
    return StoredEvent(seq, run_id, type_, version, key, _loads(payload), actor, subject, stage, ts)


def stored_from_insert(seq: int, event: NewEvent, row: tuple[Any, ...]) -> StoredEvent:
    """The StoredEvent a just-inserted insert_rows row became, without reading it back."""
    e = event
    return StoredEvent(
        seq, e.run_id, e.type, e.version, e.key, _loads(row[6]), e.actor, e.subject, e.stage, row[8]
    )


def fresh_indexes(events: Sequence[NewEvent], stored: dict[str, StoredEvent]) -> list[int]:
    """Indexes of the events to insert: the first occurrence of each key not already stored, in order."""
    first: dict[str, int] = {}
    for i, e in enumerate(events):
        if e.key not in stored:
            first.setdefault(e.key, i)
    return list(first.values())


def stale_lease(fence: Lease, row: Sequence[Any] | None) -> StaleLease | None:
    """None when `row` (owner, token, deadline, done) of the fence's task still covers the fence; else
    the StaleLease that says why it does not."""
    if row is not None and row[1] == fence.token and not row[3]:
        return None
    if row is None:
        why = "the task was never claimed"
    elif row[3]:
        why = "the task is already done"
    else:
        why = f"it was reclaimed by {row[0]} with token {row[1]}"
    return StaleLease(
        f"lease on task {fence.task!r} with token {fence.token} is stale: {why}; drop this result"
    )


def fold_rows(projection: P, rows: Iterable[Sequence[Any]]) -> P:
    """Apply rows (COLUMNS order, seq ascending) to projection; its position stays at the last event
    applied, even when apply raises."""
    apply = projection.apply
    position = projection.position
    try:
        for seq, run, type_, version, key, payload, actor, subject, stage, ts in rows:
            apply(StoredEvent(seq, run, type_, version, key, _loads(payload), actor, subject, stage, ts))
            position = seq
    finally:
        projection.position = position
    return projection


class Store(abc.ABC):
    """The generic event store's contract, whatever the database (see EventStore for its terms).

    Adapters: kernelbrain.store.sqlite.EventStore (one file, the default) and
    kernelbrain.store.postgres.PostgresStore (a server, for many hosts). kernelbrain.store.location
    opens the right one from a --db value.
    """

    #: the seconds wait_for_events sleeps between polls where the database cannot wake it
    POLL_S = 0.05
    #: whether the database itself wakes wait_for_events when an event is appended (so a waiter can
    #: wait longer between looks at what no event announces)
    WAKES_WAITERS = False

    @property
    @abc.abstractmethod
    def path(self) -> str:
        """Where the store lives, safe to print (a URL's password is masked)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def translate_error(self, e: BaseException) -> StoreError:
        """The driver's error as one of the store's, with a message that says what to do."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abc.abstractmethod
    def schema_version(self) -> int: ...

    @abc.abstractmethod
    def pending_migrations(self) -> list[str]: ...

    @abc.abstractmethod
    def append(
        self,
        events: Sequence[NewEvent],
        *,
        fence: Lease | None = None,
        complete: bool = False,
        tracking: tuple[str, int] | None = None,
        ts: Sequence[float] | None = None,
    ) -> list[StoredEvent]:
        """Append events atomically (a key already stored is a no-op); fenced by a lease, completing its
        task, moving a cursor. ts: each event's recorded time (a copied log keeps its own), else now."""

    def append_one(self, event: NewEvent, **kw: Any) -> StoredEvent:
        return self.append([event], **kw)[0]

    @abc.abstractmethod
    def read(
        self,
        after: int = 0,
        *,
        run_id: str | None = None,
        types: Iterable[str] | None = None,
        limit: int | None = None,
        until: int | None = None,
    ) -> list[StoredEvent]: ...

    def iter_events(
        self,
        after: int = 0,
        *,
        run_id: str | None = None,
        until: int | None = None,
        batch: int = 10_000,
    ) -> Iterator[StoredEvent]:
        """Like read(), in batches, so a long log never sits in memory at once."""
        while True:
            chunk = self.read(after, run_id=run_id, until=until, limit=batch)
            yield from chunk
            if len(chunk) < batch:
                return
            after = chunk[-1].seq

    @abc.abstractmethod
    def get_by_key(self, key: str) -> StoredEvent | None: ...

    @abc.abstractmethod
    def last_seq(self, run_id: str | None = None) -> int: ...

    @abc.abstractmethod
    def count(self, run_id: str | None = None, type: str | None = None) -> int: ...

    @abc.abstractmethod
    def run_ids(self) -> list[str]: ...

    @abc.abstractmethod
    def fold(self, projection: P, *, run_id: str | None = None, until: int | None = None) -> P: ...

    @abc.abstractmethod
    def put_blob(self, data: bytes | str) -> str: ...

    @abc.abstractmethod
    def get_blob(self, h: str) -> bytes: ...

    @abc.abstractmethod
    def claim(
        self,
        task: str,
        owner: str,
        ttl_s: float,
        *,
        on_claim: Callable[[Lease, Lease | None], Sequence[NewEvent]] | None = None,
        is_alive: Callable[[str], bool] | None = None,
    ) -> Lease | None: ...

    @abc.abstractmethod
    def renew(self, lease: Lease, ttl_s: float) -> Lease: ...

    @abc.abstractmethod
    def release(self, lease: Lease) -> None: ...

    @abc.abstractmethod
    def lease(self, task: str) -> Lease | None:
        """The task's current (or, once done, final) lease; None if it was never claimed."""

    @abc.abstractmethod
    def is_done(self, task: str) -> bool: ...

    @abc.abstractmethod
    def load_cursor(self, name: str) -> int: ...

    def wait_for_events(self, after: int, timeout_s: float) -> int:
        """Block until the log holds an event past seq `after`, or timeout_s passes; return last_seq().

        This version polls every POLL_S; an adapter whose database can wake it (PostgreSQL's LISTEN)
        overrides it."""
        deadline = time.monotonic() + timeout_s
        while True:
            last = self.last_seq()
            remaining = deadline - time.monotonic()
            if last > after or remaining <= 0:
                return last
            time.sleep(min(self.POLL_S, remaining))
