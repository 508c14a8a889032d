"""Reading a recorded database never changes it: `EventStore(readonly=True)` and the commands that only
read (ls, status, events, replay, audit, report, export) leave the file's bytes and mtime, and its
folder's listing, as they were. Run on copies of committed databases: a rollback-journal one recorded on
the H200 (tests/fixtures/h200/session2; the journal-mode switch of a read-write open rewrote its header)
and the WAL one in tests/fixtures."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from kernelbrain.store import EventStore, NewEvent, SchemaTooNew, StoreError
from kernelbrain.store.driver import sqlite3

from kernelbrain.core.state import RunState
from tests.kbcli import kb
from tests.test_bad_input import Snapshot, assert_user_error, corrupt_db, foreign_db, newer_db
from tests.test_bad_input import kb as kb_in

ROOT = Path(__file__).resolve().parents[1]
ROLLBACK = ROOT / "tests" / "fixtures" / "h200" / "session2" / "flat" / "softmax.db"  # journal_mode=delete
WAL = ROOT / "tests" / "fixtures" / "softmax_run.db"  # journal_mode=wal
PAST_NS = 1_500_000_000 * 10**9  # an mtime no open in this test can produce by accident


class Untouched:
    """A file's sha256 and mtime, and its folder's listing, to compare after."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.before = self._now()

    def _now(self) -> tuple[str, int, list[str]]:
        digest = hashlib.sha256(self.db.read_bytes()).hexdigest()
        return digest, self.db.stat().st_mtime_ns, sorted(os.listdir(self.db.parent))

    def check(self) -> None:
        assert self._now() == self.before


def _copy(src: Path, folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    db = folder / src.name
    shutil.copyfile(src, db)  # a copy: a committed database is never opened in place
    os.utime(db, ns=(PAST_NS, PAST_NS))
    return db


def _journal_mode(db: Path) -> int:
    return db.read_bytes()[18]  # header byte 18: 1 rollback journal, 2 WAL


def _read_everything(store: EventStore) -> int:
    (run_id, *_) = store.run_ids()
    state = store.fold(RunState(run_id), run_id=run_id)
    for c in state.candidates.values():
        store.get_blob(c.proposal.source)
    return store.count()


@pytest.mark.parametrize("src", [ROLLBACK, WAL], ids=["rollback", "wal"])
def test_a_readonly_open_leaves_a_recorded_database_as_it_was(tmp_path: Path, src: Path) -> None:
    db = _copy(src, tmp_path / "db")
    seen = Untouched(db)
    with EventStore(db, readonly=True) as store:
        assert _read_everything(store) > 0
        with pytest.raises(StoreError, match="read-only"):
            store.put_blob(b"x")
    seen.check()  # no -wal/-shm left beside it either


def test_a_read_write_open_is_what_changed_them(tmp_path: Path) -> None:
    """Why read-only commands need readonly=True: a read-write open switches the file to WAL."""
    db = _copy(ROLLBACK, tmp_path / "db")
    assert _journal_mode(db) == 1
    EventStore(db, create=False).close()
    assert _journal_mode(db) == 2


def test_a_readonly_open_beside_a_live_writer_sees_its_commits(tmp_path: Path) -> None:
    db = _copy(WAL, tmp_path / "db")
    with EventStore(db, create=False) as writer, EventStore(db, readonly=True) as reader:
        n = reader.count()
        writer.append([NewEvent(run_id="r-live", type="T", version=1, key="k", payload={}, actor="w")])
        blob = writer.put_blob(b"written while the reader is open")
        assert reader.count() == n + 1 and reader.get_blob(blob) == b"written while the reader is open"
        with pytest.raises(StoreError, match="read-only"):
            reader.append([NewEvent(run_id="r-live", type="T", version=1, key="k2", payload={}, actor="r")])


def test_a_readonly_open_leaves_a_killed_writers_log_alone(tmp_path: Path) -> None:
    """A -wal with frames no checkpoint has copied yet (a writer SIGKILLed): readonly reads through it,
    and neither the file nor the log changes (a read-write close would checkpoint it into the file)."""
    live = _copy(WAL, tmp_path / "live")
    with EventStore(live, create=False) as writer:
        blob = writer.put_blob(b"only in the -wal")
        left = tmp_path / "left"
        left.mkdir()
        for suffix in ("", "-wal"):  # what a SIGKILL leaves: the file and its uncheckpointed log
            shutil.copyfile(f"{live}{suffix}", f"{left / live.name}{suffix}")
    db = left / live.name
    assert Path(f"{db}-wal").stat().st_size > 0
    os.utime(db, ns=(PAST_NS, PAST_NS))
    wal = Path(f"{db}-wal").read_bytes()
    seen = Untouched(db)
    with EventStore(db, readonly=True) as store:
        assert store.get_blob(blob) == b"only in the -wal"
    Path(f"{db}-shm").unlink(missing_ok=True)  # SQLite's index of the -wal, rebuilt on any open
    seen.check()
    assert Path(f"{db}-wal").read_bytes() == wal


READS = {  # command: (arguments, what a good answer says)
    "ls": (["ls"], "{run}"),
    "status": (["status", "{run}"], "run {run}"),
    "events": (["events", "{run}", "--all"], "run started"),
    "replay": (["replay", "{run}"], "decisions agree"),
    "audit": (["audit", "{run}"], "Winner:"),
    "report": (["report", "{run}", "-o", "{out}/run.html"], "wrote {out}/run.html"),
    "export": (["export", "{run}", "-o", "{out}/kernel.py"], "wrote {out}/kernel.py"),
}


@pytest.mark.parametrize("command", list(READS))
def test_read_only_commands_leave_a_committed_database_as_it_was(tmp_path: Path, command: str) -> None:
    db = _copy(ROLLBACK, tmp_path / "db")
    with EventStore(db, readonly=True) as store:
        (run,) = store.run_ids()
    seen = Untouched(db)
    (tmp_path / "out").mkdir()
    args, says = READS[command]
    r = kb(*[a.format(run=run, out=tmp_path / "out") for a in args], "--db", str(db))
    assert r.returncode == 0, r.stdout + r.stderr
    assert says.format(run=run, out=tmp_path / "out") in r.stdout
    seen.check()
    assert _journal_mode(db) == 1


def empty_db(path: Path) -> str:
    path.touch()
    return "empty database"


@pytest.mark.parametrize(
    "make", [corrupt_db, newer_db, foreign_db, empty_db], ids=["corrupt", "newer", "foreign", "empty"]
)
@pytest.mark.parametrize("command", ["replay", "report", "status"])
def test_a_database_a_read_cannot_use_is_one_line_and_untouched(tmp_path: Path, make, command: str) -> None:
    db = tmp_path / "kb.db"
    what = make(db)
    snap = Snapshot(db)
    args = [a.format(run="r-x", out=tmp_path) for a in READS[command][0]]
    assert_user_error(kb_in(*args, "--db", str(db), cwd=tmp_path), str(db), what)
    snap.assert_unchanged()
    assert not (tmp_path / "run.html").exists()


def test_newer_schema_is_refused_readonly(tmp_path: Path) -> None:
    db = tmp_path / "kb.db"
    newer_db(db)
    before = db.read_bytes()
    with pytest.raises(SchemaTooNew, match="newer kb"):
        EventStore(db, readonly=True)
    assert db.read_bytes() == before
    # (a plain connection proves the file still says so)
    raw = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    assert raw.execute("SELECT max(version) FROM schema_migrations").fetchone() == (999,)
    raw.close()
