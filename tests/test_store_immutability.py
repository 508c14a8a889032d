"""The database itself refuses to rewrite history: checked through raw connections, not EventStore."""

from __future__ import annotations

import sqlite3 as stdlib_sqlite3
from pathlib import Path
from types import ModuleType

import pytest
from kernelbrain.store import EventStore, NewEvent
from kernelbrain.store.driver import sqlite3 as store_sqlite3

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
