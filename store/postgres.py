"""PostgresStore: the event store on a PostgreSQL server, so that workers on many hosts share one log.

The contract is EventStore's (kernelbrain.store.sqlite); what differs is how the server keeps it:

- seq. An append takes a transaction-scoped advisory lock (APPEND_LOCK) before it reads max(seq) and
  inserts max + 1, max + 2, ...; the lock is held until COMMIT. Appends therefore commit one at a time
  in seq order, and a reader at cursor N can never miss an event that commits later with a smaller
  seq: the log is gap-free and every snapshot holds a prefix of it. (A sequence would hand out
  numbers out of commit order and leave gaps on rollback.) Reads take no lock.
- durability. A write transaction commits with synchronous_commit off, so the lock is not held
  through the disk flush; the store then commits a one-xid transaction synchronously, whose flush
  covers the write (the WAL is one sequence), before it returns. So a write is durable when its call
  returns, and concurrent writers' flushes share one fsync. A reader may see an event a few
  milliseconds before it is on disk; anything that reader records is flushed after it, so a crash
  loses at most a suffix of the log, which the workers redo (their keys are idempotent).
- claims. One statement locks the task's lease row with FOR UPDATE SKIP LOCKED and, in the same
  statement, takes it (token + 1) when it is free, expired or the claimer's own, or inserts it
  (token 1) when the task was never claimed. A row another transaction holds is skipped: that claim
  is refused at once rather than queued. on_claim's events join the claim's transaction.
- fencing. A fenced append locks the lease row (FOR UPDATE) before it checks the token, so no claim
  can move the token between the check and the commit. Lock order is always lease row, then the
  append lock.
- waking. An AFTER INSERT trigger NOTIFYs kb_events when an append commits; wait_for_events LISTENs
  on its own connection and falls back to polling where LISTEN is not to be had.
- migrations. migrations/postgres/NNNN_*.sql, each in one transaction with its schema_migrations row,
  under MIGRATE_LOCK so that processes opening a fresh database at once apply each one once.
  UPDATE, DELETE and TRUNCATE on events and blobs are refused by triggers.

Connections come from a psycopg_pool pool (so one store may be used from several threads); a write's
nested store calls on the same thread (an on_claim that stores a blob) join its transaction. The URL's
password appears in no message: `path` and every error carry the masked URL.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from kernelbrain.store import migrate
from kernelbrain.store.base import (
    COLUMNS,
    INSERT_COLUMNS,
    Store,
    boundary,
    count_sql,
    event_from_row,
    fold_rows,
    fresh_indexes,
    insert_rows,
    read_sql,
    stale_lease,
    stored_from_insert,
)
from kernelbrain.store.errors import BlobMissing, StoreError, StoreUnavailable
from kernelbrain.store.projection import Projection
from kernelbrain.store.records import Lease, NewEvent, StoredEvent
from kernelbrain.store.urls import mask, scrub
from psycopg import errors
from psycopg_pool import ConnectionPool, PoolClosed

P = TypeVar("P", bound=Projection)
T = TypeVar("T")

# pg_advisory_xact_lock keys ("kb" and a number): per database, released at COMMIT or ROLLBACK
APPEND_LOCK = 0x6B62_0001
MIGRATE_LOCK = 0x6B62_0002
NOTIFY_CHANNEL = "kb_events"  # the channel migrations/postgres/0001_events.sql's trigger notifies
FOLD_BATCH = 20_000  # rows per fold query (keyset pages: seq > last applied)
RETRIES = 3  # a transaction the server aborted as a deadlock or a serialization failure runs again

_SELECT_LOCK = "SELECT pg_advisory_xact_lock(%s)"
_ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"
# a transaction with an xid, committed synchronously: its WAL flush covers every commit before it
_FLUSH_BARRIER = "SELECT pg_current_xact_id()"
_INSERT = f"INSERT INTO events (seq, {INSERT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
_MAX_SEQ = "SELECT coalesce(max(seq), 0) FROM events"
_MAX_SEQ_RUN = "SELECT coalesce(max(seq), 0) FROM events WHERE run_id = %s"
_BY_KEY = f"SELECT {COLUMNS} FROM events WHERE key = %s"
_BY_KEYS = f"SELECT {COLUMNS} FROM events WHERE key = ANY(%s)"
_RUN_IDS = "SELECT run_id FROM events GROUP BY run_id ORDER BY min(seq)"
_BLOB_PUT = "INSERT INTO blobs (hash, data, size) VALUES (%s, %s, %s) ON CONFLICT (hash) DO NOTHING"
_BLOB_GET = "SELECT data FROM blobs WHERE hash = %s"
_LEASE_GET = "SELECT owner, token, deadline, done FROM leases WHERE task = %s"
_LEASE_LOCK = _LEASE_GET + " FOR UPDATE"
_LEASE_RENEW = "UPDATE leases SET deadline = %s WHERE task = %s AND token = %s AND NOT done"
_LEASE_RELEASE = "UPDATE leases SET deadline = 0 WHERE task = %s AND token = %s AND NOT done"
_LEASE_DONE = "UPDATE leases SET done = true WHERE task = %s AND token = %s"
_CURSOR_GET = "SELECT position FROM cursors WHERE name = %s"
_CURSOR_SET = (
    "INSERT INTO cursors (name, position) VALUES (%s, %s)"
    " ON CONFLICT (name) DO UPDATE SET position = excluded.position"
)
# The claim, in one statement: lock the live row (skipping one another transaction holds), take it when
# it is the claimer's own, expired or its owner's death was established (dead), else insert it when the
# task has no row at all. Returns the previous holder (owner, token, deadline; NULL if none) and the new
# token (NULL: refused).
_CLAIM = """
WITH cur AS (
    SELECT task, owner, token, deadline FROM leases
    WHERE task = %(task)s AND NOT done
    FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE leases SET owner = %(owner)s, token = cur.token + 1, deadline = %(deadline)s
    FROM cur
    WHERE leases.task = cur.task
      AND (cur.owner = %(owner)s OR cur.deadline <= %(now)s OR cur.owner = %(dead)s)
    RETURNING leases.token
), fresh AS (
    INSERT INTO leases (task, owner, token, deadline)
    SELECT %(task)s, %(owner)s, 1, %(deadline)s
    WHERE NOT EXISTS (SELECT 1 FROM leases WHERE task = %(task)s)
    ON CONFLICT (task) DO NOTHING
    RETURNING token
)
SELECT cur.owner, cur.token, cur.deadline, coalesce((SELECT token FROM taken), (SELECT token FROM fresh))
FROM (VALUES (1)) AS one LEFT JOIN cur ON true
"""
_TYPES = "type = ANY(%s)"
_READ = {
    (u, r, t): read_sql(u, r, t, mark="%s", types_clause=_TYPES)
    for u in (False, True)
    for r in (False, True)
    for t in (False, True)
}
_COUNT = {(r, t): count_sql(r, t, mark="%s") for r in (False, True) for t in (False, True)}

# opening: what the database (its current schema) holds, and our migrations' bookkeeping
_CURRENT_SCHEMA = "SELECT current_schema()"
_TABLES = "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
_MIGRATION_COLUMNS = (
    "SELECT column_name FROM information_schema.columns"
    " WHERE table_schema = current_schema() AND table_name = 'schema_migrations'"
)
_CREATE_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
)
_APPLIED = "SELECT version, name FROM schema_migrations ORDER BY version"
_IS_APPLIED = "SELECT 1 FROM schema_migrations WHERE version = %s"
_RECORD = "INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)"

_boundary = boundary(psycopg.Error)


def _one(cursor: psycopg.Cursor[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The row of a statement that always returns one (an aggregate, SHOW, the claim)."""
    if (row := cursor.fetchone()) is None:
        raise StoreError("PostgreSQL returned no row for a statement that always returns one")
    return row


def _text(e: BaseException, url: str) -> str:
    """The error's message on one line, with the URL's password masked wherever it appears."""
    return scrub(" ".join(str(e).split()), url)


def translate(e: BaseException, url: str, lock_timeout_s: float) -> StoreError:
    """Map a psycopg error onto the store's exceptions, with a message that says what to do."""
    where, text = mask(url), _text(e, url)
    low = text.lower()
    if isinstance(e, errors.LockNotAvailable):
        return StoreError(
            f"{where} stayed locked by another writer past the {lock_timeout_s:g} s lock timeout"
            f" ({text}); stop the process holding it or raise the timeout"
        )
    if isinstance(e, errors.ReadOnlySqlTransaction | errors.InsufficientPrivilege):
        return StoreError(f"{where} cannot be written ({text}); check the role's privileges")
    if isinstance(e, psycopg.IntegrityError):
        return StoreError(f"{where} refused the write ({text}); fix the record being written")
    if isinstance(e, psycopg.OperationalError) and "does not exist" in low and "database" in low:
        return StoreError(f"no database at {where} ({text}); create it (createdb) or fix the URL")
    if isinstance(e, psycopg.OperationalError):
        # a refused login is no passing fault: it is not tried again (StoreUnavailable is)
        kind = (
            StoreError
            if "authentication failed" in low or "no password supplied" in low
            else StoreUnavailable
        )
        return kind(
            f"cannot reach the PostgreSQL server at {where} ({text}); check that it runs and the URL,"
            " user and password (or PGPASSWORD)"
        )
    return StoreError(f"{where}: PostgreSQL error ({text})")


def server_version(url: str, connect_timeout_s: float = 10.0) -> str:
    """The version of the server at url (SHOW server_version), or the StoreError saying why not."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=max(1, round(connect_timeout_s))) as conn:
            return str(_one(conn.execute("SHOW server_version"))[0])
    except psycopg.Error as e:
        raise translate(e, url, 0) from e


class PostgresStore(Store):
    """The event store in a PostgreSQL database (its current schema; see the module docstring).

    url: postgresql://user[:password]@host[:port]/dbname[?options]; the password may come from
    PGPASSWORD or ~/.pgpass instead. readonly=True never writes (every session is read-only too).
    lock_timeout_s bounds a wait for another writer's lock (then StoreError, as SQLite's busy timeout).
    """

    WAKES_WAITERS = True  # LISTEN kb_events (or, where LISTEN is not to be had, a poll)
    LISTEN_RECHECK_S = 1.0  # even with LISTEN, last_seq is read again this often
    POLL_FALLBACK_S = 0.25  # the poll interval where LISTEN is not to be had

    def __init__(
        self,
        url: str,
        *,
        readonly: bool = False,
        lock_timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        pool_size: int = 4,
        migrations_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._url = url
        self._path = mask(url)
        self._readonly = readonly
        self._lock_timeout_s = lock_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._local = threading.local()  # .conn: the connection of this thread's open write transaction
        self._listen: psycopg.Connection | None = None
        self._listen_lock = threading.Lock()
        self._closed = False
        try:
            self._migrations = migrate.discover(
                None if migrations_dir is None else Path(migrations_dir), dialect="postgres"
            )
            with self._connect() as conn:
                self._open(conn)
        except psycopg.Error as e:
            raise self.translate_error(e) from e
        kwargs = {"autocommit": True, "connect_timeout": max(1, round(connect_timeout_s))}
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs=kwargs,
            configure=self._configure,
            check=ConnectionPool.check_connection,  # a connection the server dropped is replaced
            timeout=max(connect_timeout_s, lock_timeout_s),
            name="kb-store",
            open=True,
        )

    def _connect(self) -> psycopg.Connection:
        timeout = max(1, round(self._connect_timeout_s))
        conn = psycopg.connect(self._url, autocommit=True, connect_timeout=timeout)
        self._configure(conn)
        return conn

    def _configure(self, conn: psycopg.Connection) -> None:
        conn.execute(f"SET lock_timeout = {int(self._lock_timeout_s * 1000)}")
        if self._readonly:
            conn.execute("SET default_transaction_read_only = on")

    def _open(self, conn: psycopg.Connection) -> None:
        """Read-only checks first (a refused database is left as it was), then the pending migrations."""
        if _one(conn.execute(_CURRENT_SCHEMA))[0] is None:
            raise StoreError(
                f"{self._path}: its search_path names no existing schema; create it or fix the URL"
            )
        tables = {row[0] for row in conn.execute(_TABLES)}
        columns = {row[0] for row in conn.execute(_MIGRATION_COLUMNS)}
        ours = None if "schema_migrations" not in tables else set(migrate.COLUMNS) <= columns
        done: dict[int, str] = dict(conn.execute(_APPLIED).fetchall()) if ours else {}
        todo = migrate.to_apply(
            self._path,
            "PostgreSQL",
            self._migrations,
            has_objects=bool(tables),
            ours=ours,
            done=done,
            readonly=self._readonly,
        )
        for m in todo:
            try:
                with conn.transaction():
                    conn.execute(_SELECT_LOCK, (MIGRATE_LOCK,))  # held until this migration commits
                    conn.execute(_CREATE_MIGRATIONS)
                    if conn.execute(_IS_APPLIED, (m.version,)).fetchone() is not None:
                        continue  # another process applied it while we waited
                    conn.execute(m.sql)  # several statements: no parameters, so the simple protocol
                    conn.execute(_RECORD, (m.version, m.name, time.time()))
            except psycopg.Error as e:
                raise StoreError(
                    f"{self._path}: migration {m.name} failed and was rolled back ({_text(e, self._url)});"
                    " fix the migration or the database"
                ) from e

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._path

    def close(self) -> None:
        self._closed = True
        with self._listen_lock:
            if self._listen is not None:
                self._listen.close()
                self._listen = None
        self._pool.close()

    def translate_error(self, e: BaseException) -> StoreError:
        if isinstance(e, PoolClosed) or self._closed:
            return StoreError(f"{self._path} is closed; open a new store")
        return translate(e, self._url, self._lock_timeout_s)

    @_boundary
    def schema_version(self) -> int:
        done = self._applied()
        return max(done) if done else 0

    @_boundary
    def pending_migrations(self) -> list[str]:
        done = self._applied()
        return [m.name for m in self._migrations if m.version not in done]

    def _applied(self) -> dict[int, str]:
        with self._connection() as conn:
            if _one(conn.execute("SELECT to_regclass('schema_migrations')"))[0] is None:
                return {}
            return dict(conn.execute(_APPLIED).fetchall())

    @_boundary
    def server_version(self) -> str:
        """The server's version string (SHOW server_version)."""
        return str(self._scalar("SHOW server_version"))

    # -- connections and transactions ------------------------------------------------------------

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        """This thread's open write transaction's connection, else one from the pool."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            yield conn
            return
        with self._pool.connection() as conn:
            yield conn

    def _rows(self, sql: str, params: Sequence[Any] = (), *, binary: bool = False) -> list[tuple[Any, ...]]:
        with self._connection() as conn:
            return conn.cursor(binary=binary).execute(sql, params).fetchall()

    def _scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._rows(sql, params)[0][0]

    def _write(self, body: Callable[[psycopg.Connection], T]) -> T:
        """Run body in one transaction; a nested call from body (same thread) joins it."""
        if self._readonly:
            raise StoreError(f"{self._path} is open read-only; open it without read-only to write")
        outer = getattr(self._local, "conn", None)
        if outer is not None:
            return body(outer)
        for attempt in range(RETRIES):
            try:
                with self._pool.connection() as conn:
                    with conn.transaction():
                        self._local.conn = conn
                        try:
                            # COMMIT releases the append lock without waiting for the disk ...
                            conn.execute(_ASYNC_COMMIT)
                            result = body(conn)
                        finally:
                            self._local.conn = None
                    # ... and this waits for it, beside every other writer's wait (group commit)
                    conn.execute(_FLUSH_BARRIER)
                    return result
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == RETRIES - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _insert(
        self, conn: psycopg.Connection, events: Sequence[NewEvent], rows: list[tuple[Any, ...]]
    ) -> list[StoredEvent]:
        """Insert rows (inside a write transaction) under the append lock; the stored event for each."""
        if not rows:
            return []
        # one round trip: the lock (blocks until ours), then the known keys and max(seq), each statement
        # with a snapshot taken after the lock was granted, so it sees every append committed before
        with conn.pipeline():
            conn.execute(_SELECT_LOCK, (APPEND_LOCK,))
            known = conn.execute(_BY_KEYS, ([e.key for e in events],))
            top = conn.execute(_MAX_SEQ)
        stored = {ev.key: ev for ev in map(event_from_row, known.fetchall())}
        before = _one(top)[0]
        fresh = fresh_indexes(events, stored)
        params = [(before + n, *rows[i]) for n, i in enumerate(fresh, start=1)]
        if len(params) == 1:
            conn.execute(_INSERT, params[0])
        elif params:
            conn.cursor().executemany(_INSERT, params)
        for n, i in enumerate(fresh, start=1):
            stored[events[i].key] = stored_from_insert(before + n, events[i], rows[i])
        return [stored[e.key] for e in events]

    def _check_fence(self, conn: psycopg.Connection, fence: Lease) -> None:
        stale = stale_lease(fence, conn.execute(_LEASE_LOCK, (fence.task,)).fetchone())
        if stale is not None:
            raise stale

    # -- events ----------------------------------------------------------------------------------

    @_boundary
    def append(
        self,
        events: Sequence[NewEvent],
        *,
        fence: Lease | None = None,
        complete: bool = False,
        tracking: tuple[str, int] | None = None,
        ts: Sequence[float] | None = None,
    ) -> list[StoredEvent]:
        if complete and fence is None:
            raise ValueError("complete=True needs the fence (lease) of the task it completes")
        if not events and fence is None and tracking is None:
            return []
        rows = insert_rows(events, time.time() if ts is None else ts)

        def body(conn: psycopg.Connection) -> list[StoredEvent]:
            if fence is not None:
                self._check_fence(conn, fence)
            stored = self._insert(conn, events, rows)
            if complete:
                conn.execute(_LEASE_DONE, (fence.task, fence.token))  # type: ignore[union-attr]
            if tracking is not None:
                conn.execute(_CURSOR_SET, tracking)
            return stored

        return self._write(body)

    def _read_params(
        self, after: int, until: int | None, run_id: str | None, types: list[str] | None, limit: int | None
    ) -> tuple[str, list[Any]]:
        params: list[Any] = [after]
        params += [p for p in (until, run_id, types) if p is not None]
        params.append(limit)  # LIMIT NULL: no limit
        return _READ[until is not None, run_id is not None, types is not None], params

    @_boundary
    def read(
        self,
        after: int = 0,
        *,
        run_id: str | None = None,
        types: Iterable[str] | None = None,
        limit: int | None = None,
        until: int | None = None,
    ) -> list[StoredEvent]:
        wanted = None if types is None else [types] if isinstance(types, str) else list(types)
        sql, params = self._read_params(after, until, run_id, wanted, limit)
        return list(map(event_from_row, self._rows(sql, params, binary=True)))

    @_boundary
    def get_by_key(self, key: str) -> StoredEvent | None:
        rows = self._rows(_BY_KEY, (key,), binary=True)
        return event_from_row(rows[0]) if rows else None

    @_boundary
    def last_seq(self, run_id: str | None = None) -> int:
        return int(self._scalar(_MAX_SEQ) if run_id is None else self._scalar(_MAX_SEQ_RUN, (run_id,)))

    @_boundary
    def count(self, run_id: str | None = None, type: str | None = None) -> int:
        params = [p for p in (run_id, type) if p is not None]
        return int(self._scalar(_COUNT[run_id is not None, type is not None], params))

    @_boundary
    def run_ids(self) -> list[str]:
        return [row[0] for row in self._rows(_RUN_IDS)]

    @_boundary
    def fold(self, projection: P, *, run_id: str | None = None, until: int | None = None) -> P:
        # keyset pages: the log is append-only and commits in seq order, so the pages make one prefix
        while True:
            sql, params = self._read_params(projection.position, until, run_id, None, FOLD_BATCH)
            rows = self._rows(sql, params, binary=True)
            fold_rows(projection, rows)
            if len(rows) < FOLD_BATCH:
                return projection

    @_boundary
    def wait_for_events(self, after: int, timeout_s: float) -> int:
        """As Store.wait_for_events, woken by NOTIFY when an append commits (polling without LISTEN)."""
        deadline = time.monotonic() + timeout_s
        with self._listen_lock:
            listener = self._listener()  # LISTEN before the first look: no wake-up falls between
            while True:
                last = self.last_seq()
                remaining = deadline - time.monotonic()
                if last > after or remaining <= 0:
                    return last
                if listener is None:
                    time.sleep(min(self.POLL_FALLBACK_S, remaining))
                    continue
                try:
                    for _ in listener.notifies(timeout=min(self.LISTEN_RECHECK_S, remaining), stop_after=1):
                        pass
                except psycopg.Error:  # the listening connection died: poll from here on
                    with contextlib.suppress(psycopg.Error):
                        listener.close()
                    self._listen = listener = None

    def _listener(self) -> psycopg.Connection | None:
        if self._listen is None or self._listen.closed:
            try:
                conn = self._connect()
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            except psycopg.Error:
                return None  # (a pooler in transaction mode, say): wait_for_events polls instead
            self._listen = conn
        return self._listen

    # -- blobs -----------------------------------------------------------------------------------

    @_boundary
    def put_blob(self, data: bytes | str) -> str:
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        h = hashlib.sha256(raw).hexdigest()
        self._write(lambda conn: conn.execute(_BLOB_PUT, (h, raw, len(raw))))
        return h

    @_boundary
    def get_blob(self, h: str) -> bytes:
        rows = self._rows(_BLOB_GET, (h,))
        if not rows:
            raise BlobMissing(f"no blob {h}")
        return bytes(rows[0][0])

    # -- leases ----------------------------------------------------------------------------------

    @_boundary
    def claim(
        self,
        task: str,
        owner: str,
        ttl_s: float,
        *,
        on_claim: Callable[[Lease, Lease | None], Sequence[NewEvent]] | None = None,
        is_alive: Callable[[str], bool] | None = None,
    ) -> Lease | None:
        def body(conn: psycopg.Connection) -> Lease | None:
            now = time.time()
            deadline = now + ttl_s
            args = {"task": task, "owner": owner, "deadline": deadline, "now": now, "dead": None}
            held_by, token, until, new_token = _one(conn.execute(_CLAIM, args))
            if new_token is None and held_by not in (None, owner) and is_alive and not is_alive(held_by):
                # live deadline, dead owner: take it (the row stays locked by us since the first statement)
                held_by, token, until, new_token = _one(conn.execute(_CLAIM, {**args, "dead": held_by}))
            if new_token is None:
                return None
            new = Lease(task, owner, new_token, deadline)
            if on_claim is not None:
                previous = None if held_by is None else Lease(task, held_by, token, until)
                events = list(on_claim(new, previous))
                self._insert(conn, events, insert_rows(events, now))
            return new

        return self._write(body)

    @_boundary
    def renew(self, lease: Lease, ttl_s: float) -> Lease:
        def body(conn: psycopg.Connection) -> Lease:
            deadline = time.time() + ttl_s
            if conn.execute(_LEASE_RENEW, (deadline, lease.task, lease.token)).rowcount != 1:
                self._check_fence(conn, lease)  # raises StaleLease with the reason
            return Lease(lease.task, lease.owner, lease.token, deadline)

        return self._write(body)

    @_boundary
    def release(self, lease: Lease) -> None:
        self._write(lambda conn: conn.execute(_LEASE_RELEASE, (lease.task, lease.token)))

    @_boundary
    def lease(self, task: str) -> Lease | None:
        """The task's current (or, once done, final) lease; None if it was never claimed."""
        rows = self._rows(_LEASE_GET, (task,))
        return None if not rows else Lease(task, rows[0][0], rows[0][1], rows[0][2])

    @_boundary
    def is_done(self, task: str) -> bool:
        rows = self._rows(_LEASE_GET, (task,))
        return bool(rows) and bool(rows[0][3])

    @_boundary
    def load_cursor(self, name: str) -> int:
        rows = self._rows(_CURSOR_GET, (name,))
        return 0 if not rows else rows[0][0]
