"""Contract suite for the event store, run against every adapter: a SQLite file, SQLite ":memory:" and a
real PostgreSQL server (tests/pg_server.py); then each adapter's opening and migration rules."""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from importlib import resources
from pathlib import Path

import psycopg
import pytest
from kernelbrain.store import (
    BlobMissing,
    CorruptDatabase,
    EventStore,
    ForeignDatabase,
    Lease,
    NewEvent,
    Projection,
    SchemaTooNew,
    StaleLease,
    StoredEvent,
    StoreError,
    migrate,
)
from kernelbrain.store.base import Store
from kernelbrain.store.driver import sqlite3
from kernelbrain.store.location import open_store
from kernelbrain.store.postgres import PostgresStore
from kernelbrain.store.urls import mask

MIGRATIONS = Path(str(resources.files("kernelbrain.store.migrations")))


def ev(key: str, run: str = "r1", type_: str = "T", **payload: object) -> NewEvent:
    return NewEvent(run_id=run, type=type_, version=1, key=key, payload=dict(payload), actor="w1")


@pytest.fixture(params=["file", "memory", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "postgres":
        path = request.getfixturevalue("pg_url")
    else:
        path = str(tmp_path / "kb.db") if request.param == "file" else ":memory:"
    with open_store(path) as s:
        yield s


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A file with the current schema, closed (so its bytes are final)."""
    path = tmp_path / "kb.db"
    with EventStore(path) as s:
        s.append([ev("seed")])
    return path


def snapshot(path: Path) -> tuple[bytes, list[str]]:
    """The file's bytes and the directory listing (no -wal/-journal left behind either)."""
    return path.read_bytes(), sorted(p.name for p in path.parent.iterdir())


def migrations_with(tmp_path: Path, **extra: str) -> Path:
    """A migrations dir holding the shipped files plus extra {stem: sql}."""
    d = tmp_path / "migrations"
    d.mkdir(exist_ok=True)
    for f in MIGRATIONS.glob("*.sql"):
        shutil.copy(f, d / f.name)
    for stem, sql in extra.items():
        (d / f"{stem}.sql").write_text(sql)
    return d


class Counter(Projection):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def apply(self, event: StoredEvent) -> None:
        self.seen.append(event.seq)


# -- events --------------------------------------------------------------------------------------


def test_append_and_read_in_order(store: Store) -> None:
    before = time.time()
    out = store.append([ev("a", n=1), ev("b", run="r2", n=2)])
    out.append(store.append_one(NewEvent("r1", "U", 3, "c", {"x": [1, 2]}, "w2", subject="cand", stage=2)))
    assert [e.seq for e in out] == [1, 2, 3]
    got = store.read()
    assert got == out  # what append returns is what everyone reads back
    assert got[2] == StoredEvent(3, "r1", "U", 3, "c", {"x": [1, 2]}, "w2", "cand", 2, got[2].ts)
    assert before <= got[0].ts <= time.time()
    assert store.last_seq() == 3 and store.last_seq("r2") == 2 and store.last_seq("nope") == 0
    assert store.run_ids() == ["r1", "r2"]


def test_empty_store(store: Store) -> None:
    assert store.read() == [] and store.last_seq() == 0 and store.count() == 0 and store.run_ids() == []
    assert store.append([]) == []


def test_idempotent_append_returns_original(store: Store) -> None:
    first = store.append_one(ev("k", v="original"))
    again = store.append_one(ev("k", v="retry"))
    assert again == first and again.payload == {"v": "original"}
    assert store.count() == 1
    # A refused duplicate burns no seq: the log stays gap-free.
    assert store.append_one(ev("k2")).seq == 2


def test_duplicates_within_and_across_a_batch(store: Store) -> None:
    old = store.append_one(ev("old", v=0))
    out = store.append([ev("new", v=1), ev("old", v=9), ev("new", v=2), ev("newer", v=3)])
    assert out[1] == old
    assert out[0] == out[2] and out[0].payload == {"v": 1}
    assert [e.seq for e in out] == [2, 1, 2, 3]
    assert [e.key for e in store.read()] == ["old", "new", "newer"]


def test_batch_append_is_atomic(store: Store) -> None:
    store.append_one(ev("a"))
    bad = NewEvent("r1", "T", 1, "c", {}, None)  # type: ignore[arg-type]  # NOT NULL actor
    with pytest.raises(StoreError, match=r"refused the write \(.*actor"):  # names the column at fault
        store.append([ev("b"), bad])
    with pytest.raises(TypeError):  # unserialisable payload: refused before the transaction
        store.append([ev("b"), ev("c", x=object())])
    assert [e.key for e in store.read()] == ["a"]
    assert store.append_one(ev("b")).seq == 2


def test_read_filters(store: Store) -> None:
    runs, types = ["r2", "r1"], ["B", "A", "A"]
    store.append([ev(f"e{i}", run=runs[i % 2], type_=types[i % 3], i=i) for i in range(1, 11)])
    assert [e.seq for e in store.read(after=7)] == [8, 9, 10]
    assert [e.seq for e in store.read(after=2, until=5)] == [3, 4, 5]
    assert [e.seq for e in store.read(limit=2)] == [1, 2]
    assert [e.seq for e in store.read(run_id="r1")] == [1, 3, 5, 7, 9]
    assert [e.seq for e in store.read(types=["B"])] == [3, 6, 9]
    assert [e.seq for e in store.read(types={"A", "B"}, run_id="r2", after=2, until=8, limit=2)] == [4, 6]
    assert store.read(types=[]) == []
    assert store.read(types="B") == store.read(types=["B"])
    assert [e.seq for e in store.iter_events(batch=3)] == list(range(1, 11))
    assert [e.seq for e in store.iter_events(after=4, run_id="r2", until=9, batch=2)] == [6, 8]
    assert store.get_by_key("e4") == store.read(after=3, limit=1)[0]
    assert store.get_by_key("missing") is None
    assert store.count() == 10 and store.count("r1") == 5 and store.count(type="B") == 3
    assert store.count("r2", "B") == 1


# -- blobs ---------------------------------------------------------------------------------------


def test_blobs(store: Store) -> None:
    h = store.put_blob(b"\x00kernel\xff")
    assert h == hashlib.sha256(b"\x00kernel\xff").hexdigest()
    assert store.get_blob(h) == b"\x00kernel\xff"
    assert store.put_blob(b"\x00kernel\xff") == h  # idempotent
    t = store.put_blob("sourcé")
    assert store.get_blob(t) == "sourcé".encode()
    with pytest.raises(KeyError, match="no blob deadbeef") as missing:
        store.get_blob("deadbeef")
    # kb's own type for a damaged database (one line from the CLI), not a bare KeyError (a bug's)
    assert isinstance(missing.value, BlobMissing) and isinstance(missing.value, StoreError)
    assert str(missing.value) == "no blob deadbeef"


# -- leases --------------------------------------------------------------------------------------


def test_claim_renew_release_done(store: Store) -> None:
    a = store.claim("t", "A", 60)
    assert a is not None and (a.task, a.owner, a.token) == ("t", "A", 1)
    assert store.lease("t") == a and store.lease("other") is None
    assert store.claim("t", "B", 60) is None  # held and alive
    renewed = store.renew(a, 120)
    assert renewed.token == 1 and renewed.deadline > a.deadline
    again = store.claim("t", "A", 60)  # the same owner may re-claim; the token still moves
    assert again is not None and again.token == 2
    store.release(again)
    b = store.claim("t", "B", 60)  # released: free for anyone
    assert b is not None and (b.owner, b.token) == ("B", 3)
    assert not store.is_done("t")
    store.append([ev("result")], fence=b, complete=True)
    assert store.is_done("t") and not store.is_done("other")
    assert store.claim("t", "B", 60) is None and store.claim("t", "C", 60) is None


def test_expired_lease_is_taken_over(store: Store) -> None:
    a = store.claim("t", "A", -1)  # already expired
    b = store.claim("t", "B", 60)
    assert a is not None and b is not None and b.token == a.token + 1


def test_fencing(store: Store) -> None:
    a = store.claim("t", "A", -1)
    b = store.claim("t", "B", 60)
    assert a is not None and b is not None
    with pytest.raises(StaleLease, match="reclaimed by B with token 2"):
        store.append([ev("from-a")], fence=a, tracking=("a", 5))
    with pytest.raises(StaleLease):
        store.renew(a, 60)
    store.release(a)  # stale release: no error, no effect
    assert store.lease("t") == b
    assert store.count() == 0 and store.load_cursor("a") == 0  # nothing written
    store.append([ev("from-b")], fence=b, complete=True)
    with pytest.raises(StaleLease, match="already done"):
        store.append([ev("late")], fence=b)
    with pytest.raises(StaleLease, match="already done"):
        store.renew(b, 60)
    with pytest.raises(StaleLease, match="never claimed"):
        store.append([ev("x")], fence=Lease("ghost", "A", 1, 0.0))
    assert [e.key for e in store.read()] == ["from-b"]
    with pytest.raises(ValueError, match="fence"):
        store.append([ev("y")], complete=True)


def test_on_claim_events_are_atomic_with_the_claim(store: Store) -> None:
    calls: list[tuple[Lease, Lease | None]] = []

    def record(new: Lease, previous: Lease | None) -> list[NewEvent]:
        calls.append((new, previous))
        return [ev(f"claimed:{new.task}:{new.token}", type_="TaskClaimed", owner=new.owner)]

    a = store.claim("t", "A", -1, on_claim=record)
    b = store.claim("t", "B", 60, on_claim=record)
    assert a is not None and b is not None
    assert calls == [(a, None), (b, a)]
    assert [e.key for e in store.read(types=["TaskClaimed"])] == ["claimed:t:1", "claimed:t:2"]

    def with_blob(new: Lease, previous: Lease | None) -> list[NewEvent]:
        h = store.put_blob(f"prompt for {new.task}")  # a nested write joins the claim's transaction
        return [ev(f"claimed:{new.task}:{new.token}", type_="TaskClaimed", prompt=h)]

    c = store.claim("v", "A", 60, on_claim=with_blob)
    assert c is not None
    assert store.get_blob(store.get_by_key("claimed:v:1").payload["prompt"]) == b"prompt for v"

    def boom(new: Lease, previous: Lease | None) -> list[NewEvent]:
        store.put_blob(b"rolled back too")
        raise RuntimeError("domain refused")

    with pytest.raises(RuntimeError):
        store.claim("u", "A", 60, on_claim=boom)
    assert store.lease("u") is None  # the claim rolled back with its events and blob
    assert store.count() == 3
    with pytest.raises(KeyError):
        store.get_blob(hashlib.sha256(b"rolled back too").hexdigest())


def test_is_alive_lets_a_dead_owners_lease_go(store: Store) -> None:
    a = store.claim("t", "A", 3600)
    assert store.claim("t", "B", 60, is_alive=lambda owner: True) is None
    b = store.claim("t", "B", 60, is_alive=lambda owner: owner != "A")
    assert a is not None and b is not None and (b.owner, b.token) == ("B", 2)


# -- cursors and projections ---------------------------------------------------------------------


def test_tracking_cursor(store: Store) -> None:
    assert store.load_cursor("gatekeeper") == 0
    store.append([ev("out1")], tracking=("gatekeeper", 7))
    assert store.load_cursor("gatekeeper") == 7
    store.append([], tracking=("gatekeeper", 9))
    assert store.load_cursor("gatekeeper") == 9


def test_fold_resumes_from_position(store: Store) -> None:
    store.append([ev(f"e{i}", run="r1" if i % 2 else "r2") for i in range(1, 7)])
    p = store.fold(Counter())
    assert p.seen == [1, 2, 3, 4, 5, 6] and p.position == 6
    store.append([ev("e7"), ev("e8")])
    assert store.fold(p).seen[-2:] == [7, 8] and p.position == 8
    assert store.fold(Counter(), until=3).seen == [1, 2, 3]
    q = store.fold(Counter(), run_id="r2", until=5)
    assert q.seen == [2, 4] and q.position == 4


def test_fold_keeps_position_of_last_applied_event(store: Store) -> None:
    store.append([ev(f"e{i}") for i in range(5)])

    class Fails(Counter):
        def apply(self, event: StoredEvent) -> None:
            if event.seq == 3:
                raise ValueError("bad event")
            super().apply(event)

    p = Fails()
    with pytest.raises(ValueError):
        store.fold(p)
    assert p.position == 2


@pytest.mark.parametrize("kind", ["file", "postgres"])
def test_closed_store_raises_store_error(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> None:
    s = open_store(request.getfixturevalue("pg_url") if kind == "postgres" else tmp_path / "kb.db")
    s.close()
    with pytest.raises(StoreError, match="closed") as info:
        s.read()
    assert isinstance(info.value.__cause__, psycopg.Error if kind == "postgres" else sqlite3.Error)


def test_wait_for_events(store: Store) -> None:
    store.append_one(ev("a"))
    t0 = time.monotonic()
    assert store.wait_for_events(0, 5.0) == 1  # already there: no wait
    assert store.wait_for_events(1, 0.2) == 1  # nothing new: back after the timeout
    assert 0.2 <= time.monotonic() - t0 < 2.0


# -- opening and migrations (file only) ----------------------------------------------------------


def test_file_store_uses_wal_and_records_migrations(db: Path) -> None:
    with EventStore(db) as s:
        assert s.path == str(db)
        assert s.schema_version() == 1 and s.pending_migrations() == []
        assert s._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    raw = sqlite3.connect(db)
    rows = raw.execute("SELECT version, name, applied_at FROM schema_migrations").fetchall()
    raw.close()
    assert [(v, n) for v, n, _ in rows] == [(1, "0001_events")]


def test_second_open_applies_nothing(db: Path) -> None:
    raw = sqlite3.connect(db)
    before = raw.execute("SELECT * FROM schema_migrations").fetchall()
    raw.close()
    with EventStore(db) as s:
        assert s._conn.total_changes == 0
        assert s.read()[0].key == "seed"
    raw = sqlite3.connect(db)
    assert raw.execute("SELECT * FROM schema_migrations").fetchall() == before
    raw.close()


def test_new_migration_is_applied_in_order(db: Path, tmp_path: Path) -> None:
    d = migrations_with(tmp_path, **{"0002_notes": "CREATE TABLE notes (x TEXT);\n-- trailing comment\n"})
    with EventStore(db, migrations_dir=d) as s:
        assert s.schema_version() == 2 and s.pending_migrations() == []
        assert s._conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 0


def test_pending_migrations_is_read_only(db: Path, tmp_path: Path) -> None:
    d = migrations_with(tmp_path, **{"0002_notes": "CREATE TABLE notes (x TEXT);"})
    before = db.read_bytes()
    raw = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)  # a read-only connection proves it
    assert [m.name for m in migrate.pending(raw, migrate.discover(d))] == ["0002_notes"]
    raw.close()
    assert db.read_bytes() == before


def test_failed_migration_rolls_back(db: Path, tmp_path: Path) -> None:
    broken = "CREATE TABLE partial (x INTEGER);\nCREATE TABLE oops (;\n"
    d = migrations_with(tmp_path, **{"0002_broken": broken})
    with pytest.raises(StoreError, match="migration 0002_broken failed and was rolled back"):
        EventStore(db, migrations_dir=d)
    with EventStore(db) as s:  # still a healthy version-1 store
        assert s.schema_version() == 1
        names = {r[0] for r in s._conn.execute("SELECT name FROM sqlite_master")}
        assert "partial" not in names and "oops" not in names


def test_newer_schema_is_refused_untouched(db: Path, tmp_path: Path) -> None:
    d = migrations_with(tmp_path, **{"0002_future": "CREATE TABLE future (x TEXT);"})
    EventStore(db, migrations_dir=d).close()
    before = snapshot(db)
    with pytest.raises(SchemaTooNew) as info:
        EventStore(db)
    assert str(info.value) == (
        f"{db} was written by a newer kb (schema 2, this kb knows 1); upgrade kernelbrain to open it"
    )
    assert snapshot(db) == before


GARBAGE = [bytes(range(256)) * 16, b"hello", b"SQLite format 3\x00" + b"\xff" * 200]


@pytest.mark.parametrize("content", GARBAGE)
def test_corrupt_file_is_refused_untouched(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "kb.db"
    path.write_bytes(content)
    before = snapshot(path)
    with pytest.raises(CorruptDatabase, match=r"is not a readable kb database \(.*\); move it aside"):
        EventStore(path)
    with pytest.raises(CorruptDatabase):
        EventStore(path, readonly=True)
    assert snapshot(path) == before


def test_foreign_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    raw.commit()
    raw.close()
    before = snapshot(path)
    with pytest.raises(ForeignDatabase, match="is a SQLite database but not a kb database; pass another"):
        EventStore(path)
    assert snapshot(path) == before


def test_foreign_schema_migrations_table_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rails.db"  # another tool's schema_migrations, different columns
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE schema_migrations (version VARCHAR PRIMARY KEY)")
    raw.execute("INSERT INTO schema_migrations VALUES ('20240101000000')")
    raw.commit()
    raw.close()
    before = snapshot(path)
    with pytest.raises(ForeignDatabase):
        EventStore(path)
    assert snapshot(path) == before


def test_empty_file_becomes_a_store(tmp_path: Path) -> None:
    path = tmp_path / "kb.db"
    path.touch()
    with EventStore(path, create=False) as s:
        assert s.schema_version() == 1


def test_create_false_does_not_create(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    with pytest.raises(StoreError, match=f"^{re.escape(f'no database at {path}')}$"):
        EventStore(path, create=False)
    with pytest.raises(StoreError, match="no database at"):
        EventStore(path, readonly=True)
    assert list(tmp_path.iterdir()) == []


def test_readonly_store_never_writes(db: Path, tmp_path: Path) -> None:
    d = migrations_with(tmp_path, **{"0002_notes": "CREATE TABLE notes (x TEXT);"})
    before = snapshot(db)  # bytes and listing: no -wal/-shm left beside it either
    with EventStore(db, readonly=True) as s:
        assert [e.key for e in s.read()] == ["seed"] and s.schema_version() == 1
        assert s.fold(Counter()).position == 1
        for write in (
            lambda: s.append([ev("x")]),
            lambda: s.put_blob(b"x"),
            lambda: s.claim("t", "A", 60),
        ):
            with pytest.raises(StoreError, match="read-only"):
                write()
    assert snapshot(db) == before
    # A database that needs migrating is refused read-only, naming the migration, untouched.
    with pytest.raises(StoreError, match="needs migrations 0002_notes"):
        EventStore(db, readonly=True, migrations_dir=d)
    assert snapshot(db) == before


def test_duplicate_migration_numbers_are_refused(tmp_path: Path) -> None:
    d = migrations_with(tmp_path, **{"0001_again": "SELECT 1;"})
    with pytest.raises(StoreError, match="two migrations numbered 0001"):
        EventStore(tmp_path / "kb.db", migrations_dir=d)
    assert not (tmp_path / "kb.db").exists()


def test_unopenable_paths_are_store_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"cannot open .*writable directory"):
        EventStore(tmp_path / "no" / "such" / "dir.db")
    with pytest.raises(StoreError, match="no migrations directory"):
        EventStore(tmp_path / "kb.db", migrations_dir=tmp_path / "nope")


def test_split_statements_keeps_trigger_bodies_whole() -> None:
    sql = (MIGRATIONS / "0001_events.sql").read_text()
    statements = migrate.split_statements(sql)
    triggers = [s for s in statements if "CREATE TRIGGER" in s]
    assert len(triggers) == 6 and all(s.rstrip().endswith("END;") for s in triggers)
    assert migrate.split_statements("SELECT ';'; SELECT 2") == ["SELECT ';';", "SELECT 2"]


# -- PostgreSQL: opening, migrations, secrets ----------------------------------------------------


def pg_migrations_with(tmp_path: Path, **extra: str) -> Path:
    d = tmp_path / "pg-migrations"
    d.mkdir(exist_ok=True)
    for f in (MIGRATIONS / "postgres").glob("*.sql"):
        shutil.copy(f, d / f.name)
    for stem, sql in extra.items():
        (d / f"{stem}.sql").write_text(sql)
    return d


def pg_state(url: str) -> tuple[list[str], list[tuple]]:
    """The database's tables and migration rows, read through a raw connection."""
    with psycopg.connect(url) as conn:
        tables = sorted(
            r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        )
        rows = (
            conn.execute("SELECT * FROM schema_migrations").fetchall()
            if "schema_migrations" in tables
            else []
        )
    return tables, rows


@pytest.fixture
def pg_db(pg_url: str) -> str:
    with open_store(pg_url) as s:
        s.append([ev("seed")])
    return pg_url


def test_pg_store_records_migrations_once(pg_db: str) -> None:
    before = pg_state(pg_db)
    assert before[0] == ["blobs", "cursors", "events", "leases", "schema_migrations"]
    assert [(v, n) for v, n, _ in before[1]] == [(1, "0001_events")]
    with open_store(pg_db) as s:
        assert isinstance(s, PostgresStore) and s.schema_version() == 1 and s.pending_migrations() == []
        assert s.server_version().startswith(("1", "2"))
        assert s.read()[0].key == "seed"
    assert pg_state(pg_db) == before  # a second open applies nothing


def test_pg_new_and_failed_migrations(pg_db: str, tmp_path: Path) -> None:
    broken = pg_migrations_with(
        tmp_path, **{"0002_broken": "CREATE TABLE partial (x int);\nCREATE TABLE oops (;"}
    )
    with pytest.raises(StoreError, match="migration 0002_broken failed and was rolled back"):
        PostgresStore(pg_db, migrations_dir=broken)
    assert "partial" not in pg_state(pg_db)[0]
    (broken / "0002_broken.sql").unlink()
    d = pg_migrations_with(tmp_path, **{"0002_notes": "CREATE TABLE notes (x TEXT);\n-- trailing comment\n"})
    with PostgresStore(pg_db, migrations_dir=d) as s:
        assert s.schema_version() == 2 and s.pending_migrations() == []
    before = pg_state(pg_db)
    with pytest.raises(SchemaTooNew) as info:  # this kb knows only 0001
        open_store(pg_db)
    assert str(info.value) == (
        f"{mask(pg_db)} was written by a newer kb (schema 2, this kb knows 1); upgrade kernelbrain to open it"
    )
    assert pg_state(pg_db) == before


def test_pg_foreign_database_is_refused_untouched(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY)")
    with pytest.raises(ForeignDatabase, match="is a PostgreSQL database but not a kb database; pass another"):
        open_store(pg_url)
    assert pg_state(pg_url) == (["customers"], [])


def test_pg_readonly_store_never_writes(pg_server, pg_db: str, tmp_path: Path) -> None:
    before = pg_state(pg_db)
    with open_store(pg_db, readonly=True) as s:
        assert [e.key for e in s.read()] == ["seed"] and s.fold(Counter()).position == 1
        for write in (lambda: s.append([ev("x")]), lambda: s.put_blob(b"x"), lambda: s.claim("t", "A", 60)):
            with pytest.raises(StoreError, match="read-only"):
                write()
    assert pg_state(pg_db) == before
    d = pg_migrations_with(tmp_path, **{"0002_notes": "CREATE TABLE notes (x TEXT);"})
    with pytest.raises(StoreError, match="needs migrations 0002_notes"):
        PostgresStore(pg_db, readonly=True, migrations_dir=d)
    fresh = pg_server.new_database()
    with pytest.raises(StoreError, match="is an empty database"):
        open_store(fresh, readonly=True)
    assert pg_state(pg_db) == before and pg_state(fresh) == ([], [])


def test_url_password_is_masked() -> None:
    url = "postgresql://kb:s3cr%40t@db.example:5432/kb?sslmode=require&password=other"
    assert mask(url) == "postgresql://kb:***@db.example:5432/kb?sslmode=require&password=***"
    assert mask("postgres://kb@h/db") == "postgres://kb@h/db" and mask("runs/kb.db") == "runs/kb.db"


def test_pg_errors_never_show_the_password(pg_server, pg_url: str) -> None:
    wrong = pg_url.replace(pg_server.password, "not-the-password-xyz")
    with pytest.raises(StoreError, match="cannot reach the PostgreSQL server") as info:
        open_store(wrong)
    assert "not-the-password-xyz" not in str(info.value) and "kb:***@" in str(info.value)
    missing = pg_server.url("no_such_db")
    with pytest.raises(StoreError, match="no database at postgresql://kb:\\*\\*\\*@") as info:
        open_store(missing)
    assert pg_server.password not in str(info.value)
    closed_port = pg_url.replace(f":{pg_server.port}/", ":1/")
    with pytest.raises(StoreError, match="cannot reach") as info:
        PostgresStore(closed_port, connect_timeout_s=2)
    assert pg_server.password not in str(info.value)


def test_pg_wait_for_events_is_woken_by_notify(pg_url: str) -> None:
    import threading

    with open_store(pg_url) as waiter, open_store(pg_url) as writer:
        assert isinstance(waiter, PostgresStore) and waiter.LISTEN_RECHECK_S >= 1.0
        timer = threading.Timer(0.3, lambda: writer.append_one(ev("late")))
        t0 = time.monotonic()
        timer.start()
        assert waiter.wait_for_events(0, 10.0) == 1
        elapsed = time.monotonic() - t0
        timer.join()
    assert 0.25 <= elapsed < 0.9  # woken by the NOTIFY, not by its once-a-second re-check
