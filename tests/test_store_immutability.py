"""The database itself refuses to rewrite history: checked through raw connections, not the store, on SQLite
and on PostgreSQL."""

from __future__ import annotations

import sqlite3 as stdlib_sqlite3
from pathlib import Path
from types import ModuleType

import psycopg
import pytest
from kernelbrain.store import EventStore, NewEvent
from kernelbrain.store.driver import sqlite3 as store_sqlite3
from kernelbrain.store.location import open_store

# Both drivers: the triggers live in the file, so any client (even an old SQLite) is refused.
DRIVERS = pytest.mark.parametrize("driver", [store_sqlite3, stdlib_sqlite3], ids=["store-driver", "stdlib"])


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "kb.db"
    with EventStore(path) as s:
        s.append_one(NewEvent("r1", "T", 1, "k1", {"v": 1}, "w1"))
        s.put_blob(b"kernel source")
    return path


def rows(driver: ModuleType, path: Path) -> tuple[list[tuple], list[tuple]]:
    conn = driver.connect(path)
    try:
        return conn.execute("SELECT * FROM events").fetchall(), conn.execute("SELECT * FROM blobs").fetchall()
    finally:
        conn.close()


@DRIVERS
@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("UPDATE events SET payload = x'7b7d'", "events are append-only"),
        ("UPDATE events SET seq = 99", "events are append-only"),
        ("DELETE FROM events", "events are append-only"),
        ("UPDATE blobs SET data = x'00'", "blobs are immutable"),
        ("DELETE FROM blobs", "blobs are immutable"),
        # REPLACE deletes without firing DELETE triggers; a BEFORE INSERT trigger closes that hole.
        (
            "INSERT OR REPLACE INTO events SELECT seq, run_id, type, version, subject, stage, 'k2', x'7b7d',"
            " actor, ts FROM events",
            "events are append-only",
        ),
        (
            "REPLACE INTO events (run_id, type, version, key, payload, actor, ts)"
            " VALUES ('r1', 'T', 1, 'k1', x'7b7d', 'evil', 0)",
            "events are append-only",
        ),
        (
            "INSERT INTO events (run_id, type, version, key, payload, actor, ts)"
            " VALUES ('r1', 'T', 1, 'k1', x'7b7d', 'w1', 0)"
            " ON CONFLICT (key) DO UPDATE SET payload = x'7b7d'",
            "events are append-only",
        ),
        ("INSERT OR REPLACE INTO blobs SELECT hash, x'00', 1 FROM blobs", "blobs are immutable"),
    ],
)
def test_history_cannot_be_rewritten(driver: ModuleType, db: Path, sql: str, message: str) -> None:
    before = rows(driver, db)
    conn = driver.connect(db)
    try:
        with pytest.raises(driver.IntegrityError, match=message):
            conn.execute(sql)
        conn.commit()
    finally:
        conn.close()
    assert rows(driver, db) == before


# -- PostgreSQL: the triggers of migrations/postgres refuse the same rewrites ---------------------


@pytest.fixture
def pg_db(pg_url: str) -> str:
    with open_store(pg_url) as s:
        s.append_one(NewEvent("r1", "T", 1, "k1", {"v": 1}, "w1"))
        s.put_blob(b"kernel source")
    return pg_url


def pg_rows(url: str) -> tuple[list[tuple], list[tuple]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT * FROM events").fetchall(), conn.execute("SELECT * FROM blobs").fetchall()


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("UPDATE events SET payload = '\\x7b7d'", "events are append-only"),
        ("UPDATE events SET seq = 99", "events are append-only"),
        ("DELETE FROM events", "events are append-only"),
        ("TRUNCATE events", "events are append-only"),
        ("UPDATE blobs SET data = '\\x00'", "blobs are immutable"),
        ("DELETE FROM blobs", "blobs are immutable"),
        ("TRUNCATE blobs", "blobs are immutable"),
        (
            "INSERT INTO events (seq, run_id, type, version, key, payload, actor, ts)"
            " VALUES (2, 'r1', 'T', 1, 'k1', '\\x7b7d', 'w1', 0)"
            " ON CONFLICT (key) DO UPDATE SET payload = excluded.payload",
            "events are append-only",
        ),
        (
            "INSERT INTO blobs SELECT hash, '\\x00', 1 FROM blobs"
            " ON CONFLICT (hash) DO UPDATE SET data = '\\x00'",
            "blobs are immutable",
        ),
    ],
)
def test_pg_history_cannot_be_rewritten(pg_db: str, sql: str, message: str) -> None:
    before = pg_rows(pg_db)
    with (
        psycopg.connect(pg_db, autocommit=True) as conn,
        pytest.raises(psycopg.IntegrityError, match=message),
    ):
        conn.execute(sql)
    assert pg_rows(pg_db) == before
