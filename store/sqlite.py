"""EventStore: the append-only event log on one SQLite file (WAL), with blobs, leases and cursors."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import orjson
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
from kernelbrain.store.driver import no_checkpoint_on_close, retry_busy, sqlite3
from kernelbrain.store.errors import BlobMissing, CorruptDatabase, StoreError
from kernelbrain.store.projection import Projection
from kernelbrain.store.records import Lease, NewEvent, StoredEvent

MEMORY = ":memory:"

P = TypeVar("P", bound=Projection)
T = TypeVar("T")

_LIST_OBJECTS = "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
_INSERT = f"INSERT INTO events ({INSERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_MAX_SEQ = "SELECT coalesce(max(seq), 0) FROM events"
# AUTOINCREMENT's counter: the largest seq ever handed out (the next insert gets counter + 1).
_SEQ_COUNTER = "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0)"
_MAX_SEQ_RUN = "SELECT coalesce(max(seq), 0) FROM events WHERE run_id = ?"
_BY_KEY = f"SELECT {COLUMNS} FROM events WHERE key = ?"
_BY_KEYS = f"SELECT {COLUMNS} FROM events WHERE key IN (SELECT value FROM json_each(?))"
_RUN_IDS = "SELECT run_id FROM events GROUP BY run_id ORDER BY min(seq)"
_BLOB_EXISTS = "SELECT 1 FROM blobs WHERE hash = ?"
_BLOB_PUT = "INSERT INTO blobs (hash, data, size) VALUES (?, ?, ?)"
_BLOB_GET = "SELECT data FROM blobs WHERE hash = ?"
_LEASE_GET = "SELECT owner, token, deadline, done FROM leases WHERE task = ?"
_LEASE_NEW = "INSERT INTO leases (task, owner, token, deadline) VALUES (?, ?, 1, ?)"
_LEASE_TAKE = "UPDATE leases SET owner = ?, token = ?, deadline = ? WHERE task = ?"
_LEASE_RENEW = "UPDATE leases SET deadline = ? WHERE task = ? AND token = ? AND done = 0"
_LEASE_RELEASE = "UPDATE leases SET deadline = 0 WHERE task = ? AND token = ? AND done = 0"
_LEASE_DONE = "UPDATE leases SET done = 1 WHERE task = ? AND token = ?"
_CURSOR_GET = "SELECT position FROM cursors WHERE name = ?"
_CURSOR_SET = (
    "INSERT INTO cursors (name, position) VALUES (?, ?)"
    " ON CONFLICT (name) DO UPDATE SET position = excluded.position"
)


_TYPES = "type IN (SELECT value FROM json_each(?))"
_READ = {
    (u, r, t): read_sql(u, r, t, mark="?", types_clause=_TYPES)
    for u in (False, True)
    for r in (False, True)
    for t in (False, True)
}
_COUNT = {(r, t): count_sql(r, t, mark="?") for r in (False, True) for t in (False, True)}


def _translate(e: sqlite3.Error, path: str, busy_timeout_s: float) -> StoreError:
    """Map a sqlite3 error onto the store's exceptions, with a message that says what to do."""
    name = getattr(e, "sqlite_errorname", "") or ""
    text = str(e)
    low = text.lower()
    if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")) or "not a database" in low or "malformed" in low:
        return CorruptDatabase(
            f"{path} is not a readable kb database ({text}); move it aside or pass another --db"
        )
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in low:
        return StoreError(
            f"{path} stayed locked by another writer past the {busy_timeout_s:g} s busy timeout ({text});"
            " stop the process holding it or raise the timeout"
        )
    if name.startswith("SQLITE_IOERR") or "disk i/o error" in low:
        return StoreError(
            f"{path} could not be written ({text}); check that its disk has room and that the file, its "
            "-wal and -shm and its folder are writable"
        )
    if name.startswith("SQLITE_READONLY") or "readonly" in low:
        return StoreError(f"{path} cannot be written ({text}); check file permissions or open it read-only")
    if name.startswith("SQLITE_CANTOPEN") or "unable to open" in low:
        return StoreError(f"cannot open {path} ({text}); check that it is a file in a writable directory")
    if isinstance(e, sqlite3.IntegrityError):
        return StoreError(f"{path} refused the write ({text}); fix the record being written")
    if isinstance(e, sqlite3.ProgrammingError) and "closed" in low:
        return StoreError(f"{path} is closed; open a new EventStore")
    return StoreError(f"{path}: SQLite error ({text})")


_translated = boundary(sqlite3.Error)
A = ParamSpec("A")


def _boundary(fn: Callable[Concatenate[EventStore, A], T]) -> Callable[Concatenate[EventStore, A], T]:
    """A public method: its sqlite3 errors become StoreErrors, and it runs on a read-only connection
    while the database's files cannot be written (EventStore._follow_permissions)."""

    @functools.wraps(fn)
    def guarded(store: EventStore, /, *args: A.args, **kwargs: A.kwargs) -> T:
        store._follow_permissions()
        return fn(store, *args, **kwargs)

    return _translated(guarded)


def _unwritable(name: str) -> bool:
    """Whether the file exists and cannot be opened for writing. One open, not access-then-exists: the
    -wal and -shm come and go with other processes' connections, and a file made between the two calls
    (access failing on its absence, exists finding it) read as read-only under eight appenders."""
    try:
        fd = os.open(name, os.O_WRONLY)
    except (FileNotFoundError, NotADirectoryError):  # not there (nor, under a file, can it be)
        return False
    except OSError:
        return True
    os.close(fd)
    return False


class EventStore(Store):
    """The generic event store: an append-only log of events in one SQLite file.

    Contract:
    - Events get a global, gap-free `seq` (1, 2, ...) in commit order; readers always see a prefix.
      UPDATE/DELETE on events (and blobs) are refused by database triggers.
    - `append` is one BEGIN IMMEDIATE transaction: all events or none. An event whose `key` already
      exists is not inserted; the ORIGINAL stored event is returned in its place (idempotence). The
      result lists stored events in input order.
    - Fencing: `append(..., fence=lease)` writes only while `lease.token` is the task's current token
      and the task is not done, else StaleLease and nothing is written. `complete=True` marks the
      task done in the same transaction; a done task can never be claimed again.
    - `tracking=(name, position)` stores a follower's cursor in the same transaction as its outputs.
    - `claim` is one transaction: free, expired, dead-owner (`is_alive`) or own leases are taken
      with token + 1; `on_claim(new, previous)` returns events appended atomically with the claim.
      Callbacks run under the write lock and may run again if the transaction is retried: keep
      them quick and pure. Store writes made from them join the claim's transaction.
    - Blobs are content-addressed by sha256 and immutable.
    - Opening never writes to bad input: a missing file (create=False), a non-SQLite file, a schema
      newer than this code, or another program's database is refused with the file untouched.
      Otherwise the file is switched to WAL and pending migrations are applied.
    - readonly=True never writes: no journal-mode switch, no migration. The file keeps its bytes and
      mtime, and a closed file gets no -wal/-shm left beside it (for committed result databases).
    - Every sqlite3 error leaving a public method is a StoreError (CorruptDatabase for unreadable
      files). "database is locked" does not escape under normal contention: busy_timeout and
      BEGIN IMMEDIATE, plus a retry of the whole transaction.
    - One connection per EventStore; use an instance from one thread. ":memory:" works (no WAL).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        readonly: bool = False,
        busy_timeout_s: float = 60.0,
        migrations_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._path = os.fspath(path)
        self._readonly = readonly
        self._busy_timeout_s = busy_timeout_s
        self._migrations = migrate.discover(None if migrations_dir is None else Path(migrations_dir))
        memory = self._path == MEMORY
        if not memory and not os.path.exists(self._path) and (not create or readonly):
            # Checked before connecting: sqlite3.connect would create the file.
            raise StoreError(f"no database at {self._path}")
        if not memory and not readonly and (blocked := self._unwritable()):
            raise self._read_only(blocked)
        self._fallen_back = False  # on a mode=ro connection: the files turned read-only under it
        self._conn = self._connect(self._path if memory else self._uri())
        try:
            self._open()
        except BaseException:
            self._conn.close()
            raise

    def _connect(self, target: str) -> sqlite3.Connection:
        try:
            return sqlite3.connect(
                target,
                uri=self._path != MEMORY,
                isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                check_same_thread=False,
                timeout=self._busy_timeout_s,
            )
        except sqlite3.Error as e:
            raise _translate(e, self._path, self._busy_timeout_s) from e

    def _follow_permissions(self) -> None:
        """Where the database's files cannot be written any more (a read-only remount, chattr +i), go on
        reading through a mode=ro connection, and back to the usual one once they can.

        A connection that mapped the -shm while it was writable writes there when a read moves its read
        mark, and when it closes last (the checkpoint); on a file that can no longer be written, such a
        write to a mapped page is a SIGBUS, which kills the process. A mode=ro connection maps the -shm
        read-only and writes nothing. Writes are refused meanwhile, with one line (_write)."""
        if self._path == MEMORY or self._conn.in_transaction:
            return
        blocked = self._unwritable(self._path + "-shm") is not None  # the file it maps: one call
        if blocked == self._fallen_back:
            return
        old = self._conn
        if blocked:
            no_checkpoint_on_close(old, self._path)
            target = f"{Path(self._path).absolute().as_uri()}?mode=ro"
        else:
            target = self._uri()
        self._conn = self._connect(target)
        self._conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
        if self._readonly:
            self._conn.execute("PRAGMA query_only = ON")
        elif not blocked:
            self._conn.execute("PRAGMA synchronous = FULL")
        self._fallen_back = blocked
        old.close()

    def _uri(self) -> str:
        # mode=rw never creates the file (closing the exists/connect race); a read never creates it.
        mode = "rw" if self._readonly or os.path.exists(self._path) else "rwc"
        if self._readonly and any(os.path.exists(self._path + s) for s in ("-wal", "-journal")):
            # Someone's log beside it (a live writer, or one killed): a rw connection closing last
            # would checkpoint it into the file, or roll the journal back. mode=ro cannot.
            mode = "ro"
        # Otherwise readonly is rw + query_only: mode=ro beside a WAL file with no -wal yet leaves an
        # empty -wal and -shm behind (a read-only connection cannot delete them); a rw connection
        # that never writes leaves the file's bytes and mtime alone and removes both on close.
        return f"{Path(self._path).absolute().as_uri()}?mode={mode}"

    def _open(self) -> None:
        """Checks in an order that guarantees a refused file is left byte-identical."""
        c = self._conn
        c.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")  # connection-only
        if self._readonly:
            c.execute("PRAGMA query_only = ON")  # before the first read: nothing below can write
        try:
            c.execute("BEGIN")  # deferred: one read snapshot for all the checks, no lock taken yet
            try:
                objects = {row[0] for row in c.execute(_LIST_OBJECTS)}
                ours = migrate.is_ours(c)
                done = migrate.applied(c) if ours else {}
            finally:
                if c.in_transaction:  # (SQLite may already have ended it after an error)
                    c.execute("ROLLBACK")  # nothing was written; this just ends the read
        except sqlite3.Error as e:
            raise _translate(e, self._path, self._busy_timeout_s) from e
        todo = migrate.to_apply(
            self._path,
            "SQLite",
            self._migrations,
            has_objects=bool(objects),
            ours=ours,
            done=done,
            readonly=self._readonly,
        )
        if self._readonly:
            return
        try:
            # journal_mode=WAL writes the file header, hence only after the checks above.
            retry_busy(lambda: c.execute("PRAGMA journal_mode = WAL").fetchone())
            c.execute("PRAGMA synchronous = FULL")
            for m in todo:
                try:
                    retry_busy(functools.partial(migrate.apply, c, m))
                except sqlite3.Error as e:
                    raise StoreError(
                        f"{self._path}: migration {m.name} failed and was rolled back ({e});"
                        " fix the migration or the database"
                    ) from e
        except sqlite3.Error as e:
            raise _translate(e, self._path, self._busy_timeout_s) from e

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._path

    def close(self) -> None:
        if self._path != MEMORY and self._unwritable():
            # the last connection's close checkpoints, writing the -shm it maps: a SIGBUS there now
            no_checkpoint_on_close(self._conn, self._path)
        self._conn.close()

    def _unwritable(self, *names: str) -> str | None:
        """The first of `names` (default: the database's files, itself, its -wal and -shm) that exists
        and cannot be written (a read-only mount, an immutable file, its mode), else None."""
        for name in names or (self._path, self._path + "-wal", self._path + "-shm"):
            if not os.access(name, os.W_OK) and _unwritable(name):  # (access first: one call a file)
                return name
        return None

    def _read_only(self, blocked: str) -> StoreError:
        return StoreError(
            f"{self._path} cannot be written: {blocked} is read-only (a read-only mount, an immutable "
            "file or its mode); make it writable"
        )

    def translate_error(self, e: BaseException) -> StoreError:
        assert isinstance(e, sqlite3.Error)
        return _translate(e, self._path, self._busy_timeout_s)

    @_boundary
    def schema_version(self) -> int:
        done = migrate.applied(self._conn)
        return max(done) if done else 0

    @_boundary
    def pending_migrations(self) -> list[str]:
        return [m.name for m in migrate.pending(self._conn, self._migrations)]

    # -- transactions ----------------------------------------------------------------------------

    def _write(self, body: Callable[[], T]) -> T:
        """Run body in one BEGIN IMMEDIATE transaction, retried as a whole if SQLite stays busy."""
        if self._readonly:
            raise StoreError(f"{self._path} is open read-only; open it without read-only to write")
        c = self._conn
        if self._path != MEMORY and not c.in_transaction and (blocked := self._unwritable()):
            # refused before SQLite writes: it would map the -shm and write there, a SIGBUS where that
            # file has become read-only since it was mapped
            raise self._read_only(blocked)
        if c.in_transaction:
            # Called from inside our own transaction (e.g. on_claim stores a blob): join it, so the
            # nested write commits or rolls back with the outer one.
            return body()

        def transaction() -> T:
            c.execute("BEGIN IMMEDIATE")
            try:
                result = body()
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:
                    with contextlib.suppress(sqlite3.Error):  # the original error is the news
                        c.execute("ROLLBACK")
                raise
            return result

        return retry_busy(transaction)

    def _insert(self, events: Sequence[NewEvent], rows: list[tuple[Any, ...]]) -> list[StoredEvent]:
        """Insert rows (inside a write transaction); return the stored event for every input."""
        if not rows:
            return []
        c = self._conn
        # Look existing keys up first rather than INSERT ... ON CONFLICT DO NOTHING: a colliding insert
        # is refused by the no-replace trigger, and with AUTOINCREMENT it would burn a seq anyway.
        if len(events) == 1:
            found = c.execute(_BY_KEY, (events[0].key,)).fetchall()
        else:
            found = c.execute(_BY_KEYS, (orjson.dumps([e.key for e in events]).decode(),)).fetchall()
        stored = {ev.key: ev for ev in map(event_from_row, found)}
        fresh = fresh_indexes(events, stored)
        if fresh:
            # We hold the write lock and nothing is refused, so AUTOINCREMENT hands out counter+1, +2, ..
            # in input order (its counter is >= every seq ever used; events are never deleted).
            before = c.execute(_SEQ_COUNTER).fetchone()[0]
            c.executemany(_INSERT, rows if len(fresh) == len(rows) else [rows[i] for i in fresh])
            for seq, i in enumerate(fresh, start=before + 1):
                stored[events[i].key] = stored_from_insert(seq, events[i], rows[i])
        return [stored[e.key] for e in events]

    def _check_fence(self, fence: Lease) -> None:
        stale = stale_lease(fence, self._conn.execute(_LEASE_GET, (fence.task,)).fetchone())
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

        def body() -> list[StoredEvent]:
            if fence is not None:
                self._check_fence(fence)
            stored = self._insert(events, rows)
            if complete:
                self._conn.execute(_LEASE_DONE, (fence.task, fence.token))  # type: ignore[union-attr]
            if tracking is not None:
                self._conn.execute(_CURSOR_SET, tracking)
            return stored

        return self._write(body)

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
        params: list[Any] = [after]
        if until is not None:
            params.append(until)
        if run_id is not None:
            params.append(run_id)
        if types is not None:
            wanted = [types] if isinstance(types, str) else list(types)  # a lone str means one type
            params.append(orjson.dumps(wanted).decode())
        params.append(-1 if limit is None else limit)
        sql = _READ[until is not None, run_id is not None, types is not None]
        return list(map(event_from_row, self._conn.execute(sql, params)))

    @_boundary
    def get_by_key(self, key: str) -> StoredEvent | None:
        row = self._conn.execute(_BY_KEY, (key,)).fetchone()
        return None if row is None else event_from_row(row)

    @_boundary
    def last_seq(self, run_id: str | None = None) -> int:
        if run_id is None:
            return int(self._conn.execute(_MAX_SEQ).fetchone()[0])
        return int(self._conn.execute(_MAX_SEQ_RUN, (run_id,)).fetchone()[0])

    @_boundary
    def count(self, run_id: str | None = None, type: str | None = None) -> int:
        params = [p for p in (run_id, type) if p is not None]
        return int(self._conn.execute(_COUNT[run_id is not None, type is not None], params).fetchone()[0])

    @_boundary
    def run_ids(self) -> list[str]:
        return [row[0] for row in self._conn.execute(_RUN_IDS)]

    @_boundary
    def fold(self, projection: P, *, run_id: str | None = None, until: int | None = None) -> P:
        params: list[Any] = [projection.position]
        if until is not None:
            params.append(until)
        if run_id is not None:
            params.append(run_id)
        params.append(-1)
        # One statement = one read snapshot.
        return fold_rows(
            projection, self._conn.execute(_READ[until is not None, run_id is not None, False], params)
        )

    # -- blobs -----------------------------------------------------------------------------------

    @_boundary
    def put_blob(self, data: bytes | str) -> str:
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        h = hashlib.sha256(raw).hexdigest()
        c = self._conn

        def body() -> None:
            if c.execute(_BLOB_EXISTS, (h,)).fetchone() is None:  # re-checked under the write lock
                c.execute(_BLOB_PUT, (h, raw, len(raw)))

        if c.execute(_BLOB_EXISTS, (h,)).fetchone() is None:  # a known blob needs no write lock
            self._write(body)
        return h

    @_boundary
    def get_blob(self, h: str) -> bytes:
        row = self._conn.execute(_BLOB_GET, (h,)).fetchone()
        if row is None:
            raise BlobMissing(f"no blob {h}")
        return bytes(row[0])

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
        def refused(row: tuple[Any, ...] | None, now: float) -> bool:
            if row is None:
                return False
            held_by, _, deadline, done = row
            if done:
                return True
            return held_by != owner and deadline > now and (is_alive is None or is_alive(held_by))

        # Read-only pre-check: a done or live-held task is refused without taking the write lock.
        if refused(self._conn.execute(_LEASE_GET, (task,)).fetchone(), time.time()):
            return None

        def body() -> Lease | None:
            c = self._conn
            now = time.time()
            row = c.execute(_LEASE_GET, (task,)).fetchone()
            if refused(row, now):
                return None
            if row is None:
                previous = None
                c.execute(_LEASE_NEW, (task, owner, now + ttl_s))
                new = Lease(task, owner, 1, now + ttl_s)
            else:
                previous = Lease(task, row[0], row[1], row[2])
                new = Lease(task, owner, row[1] + 1, now + ttl_s)
                c.execute(_LEASE_TAKE, (owner, new.token, new.deadline, task))
            if on_claim is not None:
                events = list(on_claim(new, previous))
                self._insert(events, insert_rows(events, now))
            return new

        return self._write(body)

    @_boundary
    def renew(self, lease: Lease, ttl_s: float) -> Lease:
        def body() -> Lease:
            deadline = time.time() + ttl_s
            if self._conn.execute(_LEASE_RENEW, (deadline, lease.task, lease.token)).rowcount != 1:
                self._check_fence(lease)  # raises StaleLease with the reason
            return Lease(lease.task, lease.owner, lease.token, deadline)

        return self._write(body)

    @_boundary
    def release(self, lease: Lease) -> None:
        self._write(lambda: self._conn.execute(_LEASE_RELEASE, (lease.task, lease.token)))

    @_boundary
    def lease(self, task: str) -> Lease | None:
        """The task's current (or, once done, final) lease; None if it was never claimed."""
        row = self._conn.execute(_LEASE_GET, (task,)).fetchone()
        return None if row is None else Lease(task, row[0], row[1], row[2])

    @_boundary
    def is_done(self, task: str) -> bool:
        row = self._conn.execute(_LEASE_GET, (task,)).fetchone()
        return row is not None and bool(row[3])

    @_boundary
    def load_cursor(self, name: str) -> int:
        row = self._conn.execute(_CURSOR_GET, (name,)).fetchone()
        return 0 if row is None else row[0]
