"""Real processes sharing one store, a SQLite file or a database on a real PostgreSQL server: appends,
claims, stale leases, readers beside writers, a first open raced by many; and each adapter's lock waits."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from kernelbrain.store import EventStore, NewEvent, StoreError
from kernelbrain.store.driver import sqlite3
from kernelbrain.store.location import open_store
from kernelbrain.store.postgres import APPEND_LOCK, PostgresStore

ROOT = Path(__file__).resolve().parents[1]

# The child side: `python -c WORKER ROLE DB DIR NAME [ARGS...]`. Each role waits at a file barrier
# so that all processes hit the database at once, then prints one JSON line.
WORKER = r"""
import json, random, sys, time
from pathlib import Path
from kernelbrain.store import NewEvent, StaleLease
from kernelbrain.store.location import open_store

def barrier(d, name):
    Path(d, f"ready.{name}").touch()
    give_up = time.time() + 60
    while not Path(d, "go").exists():
        if time.time() > give_up:
            sys.exit("barrier timeout")
        time.sleep(0.001)

def appender(db, d, name, n):
    with open_store(db) as s:
        barrier(d, name)
        t0 = time.perf_counter()
        for i in range(int(n)):
            s.append_one(NewEvent("run", "Appended", 1, f"{name}:{i}", {"proc": name, "i": i}, name))
        print(json.dumps({"elapsed": time.perf_counter() - t0}))

def opener(db, d, name):
    barrier(d, name)
    with open_store(db) as s:
        s.append_one(NewEvent("run", "Opened", 1, f"open:{name}", {}, name))
    print("{}")

def claimer(db, d, name, ntasks):
    tasks = [f"task{j}" for j in range(int(ntasks))]
    random.Random(name).shuffle(tasks)

    def claimed(new, previous):
        payload = {"task": new.task, "owner": new.owner, "token": new.token}
        return [NewEvent("run", "TaskClaimed", 1, f"claim:{new.task}:{new.token}", payload, name)]

    won = []
    with open_store(db) as s:
        barrier(d, name)
        for task in tasks:
            lease = s.claim(task, name, 60.0, on_claim=claimed)
            if lease is not None:
                payload = {"task": task, "owner": name}
                done = NewEvent("run", "TaskDone", 1, f"done:{task}:{name}", payload, name)
                s.append([done], fence=lease, complete=True)
                won.append(task)
    print(json.dumps({"won": won}))

def stale_owner(db, d, name):
    with open_store(db) as s:
        lease = s.claim("job", name, 0.2)
        print(json.dumps({"token": lease.token, "deadline": lease.deadline}), flush=True)
        Path(d, "a-claimed").touch()
        time.sleep(0.3)  # past the deadline: a stalled (not dead) worker
        give_up = time.time() + 30
        while not Path(d, "b-claimed").exists():
            if time.time() > give_up:
                sys.exit("b never reclaimed")
            time.sleep(0.01)
        try:
            s.append([NewEvent("run", "Result", 1, f"result:{name}", {"by": name}, name)], fence=lease)
        except StaleLease as e:
            print(json.dumps({"stale": str(e)}))
            return
        sys.exit("late append with a stale fence was accepted")

def reader(db, d, name):
    last, loops = 0, 0
    with open_store(db) as s:
        barrier(d, name)
        while True:
            stop = Path(d, "stop").exists()  # checked before reading, so the last read sees everything
            batch = s.read(after=last)
            seqs = [e.seq for e in batch]
            if seqs != list(range(last + 1, last + 1 + len(seqs))):
                sys.exit(f"reader saw a gap or disorder after {last}: {seqs[:5]}")
            last = seqs[-1] if seqs else last
            loops += 1
            if stop:
                break
    print(json.dumps({"last": last, "loops": loops}))

globals()[sys.argv[1]](*sys.argv[2:])
"""


class Procs:
    """Children started behind a file barrier; their output is checked for errors on the way out."""

    def __init__(self, db: Path | str, workdir: Path) -> None:
        self.db, self.dir = db, workdir
        self.procs: dict[str, subprocess.Popen[str]] = {}
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        self.env = {**os.environ, "PYTHONPATH": pythonpath}

    def spawn(self, role: str, name: str, *args: object) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-c", WORKER, role, str(self.db), str(self.dir), name, *map(str, args)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        self.procs[name] = p
        return p

    def go(self, names: list[str]) -> None:
        give_up = time.time() + 60
        while not all((self.dir / f"ready.{n}").exists() for n in names):
            for n in names:
                if self.procs[n].poll() is not None:
                    self.result(n, 1)  # died before the barrier: show why
            assert time.time() < give_up, "children never reached the barrier"
            time.sleep(0.01)
        (self.dir / "go").touch()

    def result(self, name: str, timeout: float) -> dict:
        out, err = self.procs[name].communicate(timeout=timeout)
        assert "locked" not in err.lower(), f"{name}: {err}"
        assert self.procs[name].returncode == 0, f"{name} exited {self.procs[name].returncode}: {err}"
        return json.loads(out.strip().splitlines()[-1])

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture(params=["sqlite", "postgres"])
def procs(request: pytest.FixtureRequest, tmp_path: Path):
    db = request.getfixturevalue("pg_url") if request.param == "postgres" else tmp_path / "kb.db"
    open_store(db).close()  # like `kb run`: the database exists before its workers start
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    p = Procs(db, barrier)
    yield p
    p.kill_all()


def test_parallel_single_appends(procs: Procs) -> None:
    names, n = [f"p{k}" for k in range(8)], 500
    for name in names:
        procs.spawn("appender", name, n)
    procs.go(names)
    for name in names:
        procs.result(name, timeout=120)
    with open_store(procs.db) as s:
        events = s.read()
    assert len(events) == 8 * n
    assert [e.seq for e in events] == list(range(1, 8 * n + 1))  # strictly increasing, gap-free
    seen = collections.Counter((e.payload["proc"], e.payload["i"]) for e in events)
    assert seen == collections.Counter({(name, i): 1 for name in names for i in range(n)})
    for name in names:  # each process's own events are in its order
        assert [e.payload["i"] for e in events if e.actor == name] == list(range(n))


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_parallel_first_open_migrates_once(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # no file yet, or an empty database: every child races to create the schema
    procs = Procs(request.getfixturevalue("pg_url") if kind == "postgres" else tmp_path / "fresh.db", barrier)
    names = [f"o{k}" for k in range(8)]
    try:
        for name in names:
            procs.spawn("opener", name)
        procs.go(names)
        for name in names:
            procs.result(name, timeout=60)
    finally:
        procs.kill_all()
    with open_store(procs.db) as s:
        assert s.count(type="Opened") == 8
    if kind == "postgres":
        with psycopg.connect(str(procs.db)) as raw:
            assert raw.execute("SELECT version FROM schema_migrations").fetchall() == [(1,)]
    else:
        with contextlib.closing(sqlite3.connect(procs.db)) as raw:
            assert raw.execute("SELECT version FROM schema_migrations").fetchall() == [(1,)]


def test_parallel_claims_complete_each_task_once(procs: Procs) -> None:
    names, ntasks = [f"c{k}" for k in range(8)], 100
    for name in names:
        procs.spawn("claimer", name, ntasks)
    procs.go(names)
    won = {name: procs.result(name, timeout=120)["won"] for name in names}
    with open_store(procs.db) as s:
        done = s.read(types=["TaskDone"])
        claims = s.read(types=["TaskClaimed"])
        leases = {f"task{j}": s.lease(f"task{j}") for j in range(ntasks)}
        assert all(s.is_done(task) for task in leases)
    tasks = [f"task{j}" for j in range(ntasks)]
    assert sorted(e.payload["task"] for e in done) == sorted(tasks)  # each completed exactly once
    assert sorted(e.payload["task"] for e in claims) == sorted(tasks)  # each claimed exactly once
    assert all(e.payload["token"] == 1 for e in claims)
    owner = {e.payload["task"]: e.payload["owner"] for e in claims}
    assert {e.payload["task"]: e.payload["owner"] for e in done} == owner
    assert {t: lease.owner for t, lease in leases.items() if lease} == owner
    assert sorted(t for ts in won.values() for t in ts) == sorted(tasks)


def test_stale_lease_cannot_write(procs: Procs) -> None:
    a = procs.spawn("stale_owner", "A")
    give_up = time.time() + 30
    while not (procs.dir / "a-claimed").exists():
        assert a.poll() is None and time.time() < give_up, "A never claimed"
        time.sleep(0.01)
    with open_store(procs.db) as s:
        b = s.claim("job", "B", 30.0)
        while b is None:  # A's lease is live for 0.2 s
            assert time.time() < give_up
            time.sleep(0.02)
            b = s.claim("job", "B", 30.0)
        assert b.token == 2
        (procs.dir / "b-claimed").touch()
        out = procs.result("A", timeout=30)
        assert "reclaimed by B with token 2" in out["stale"]
        s.append([NewEvent("run", "Result", 1, "result:B", {"by": "B"}, "B")], fence=b, complete=True)
        assert [e.key for e in s.read()] == ["result:B"]  # A's late result left no trace
        assert s.is_done("job")


def test_reader_beside_writers(procs: Procs) -> None:
    writers, n = [f"w{k}" for k in range(3)], 300
    for name in writers:
        procs.spawn("appender", name, n)
    procs.spawn("reader", "reader")
    procs.go([*writers, "reader"])
    elapsed = [procs.result(name, timeout=60)["elapsed"] for name in writers]
    (procs.dir / "stop").touch()
    seen = procs.result("reader", timeout=60)
    assert seen["last"] == 3 * n and seen["loops"] > 1
    assert max(elapsed) < 30, elapsed  # the reader never stalled the writers


class WriteLockHolder(threading.Thread):
    """Another connection holding the write lock (BEGIN IMMEDIATE) until `seconds` pass or stop()."""

    def __init__(self, db: Path, seconds: float) -> None:
        super().__init__()
        self.db, self.seconds = db, seconds
        self.locked, self.release = threading.Event(), threading.Event()
        self.start()
        assert self.locked.wait(10)

    def run(self) -> None:
        conn = sqlite3.connect(self.db, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        self.locked.set()
        self.release.wait(self.seconds)
        conn.execute("COMMIT")
        conn.close()

    def stop(self) -> None:
        self.release.set()
        self.join()


def test_writer_waits_for_a_held_lock(tmp_path: Path) -> None:
    db = tmp_path / "kb.db"
    with open_store(db) as s:
        holder = WriteLockHolder(db, 0.3)
        t0 = time.perf_counter()
        s.append_one(NewEvent("run", "T", 1, "k", {}, "w"))
        assert time.perf_counter() - t0 >= 0.2  # it waited instead of failing
        holder.stop()


def test_lock_held_past_the_timeout_is_a_store_error(tmp_path: Path) -> None:
    db = tmp_path / "kb.db"
    with EventStore(db, busy_timeout_s=0.01) as s:
        holder = WriteLockHolder(db, 30.0)
        try:
            with pytest.raises(StoreError, match="stayed locked by another writer") as info:
                s.append_one(NewEvent("run", "T", 1, "k", {}, "w"))
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        finally:
            holder.stop()
        assert s.count() == 0


class AppendLockHolder(threading.Thread):
    """Another connection holding the PostgreSQL store's append lock until `seconds` pass or stop()."""

    def __init__(self, url: str, seconds: float) -> None:
        super().__init__()
        self.url, self.seconds = url, seconds
        self.locked, self.release = threading.Event(), threading.Event()
        self.start()
        assert self.locked.wait(10)

    def run(self) -> None:
        with psycopg.connect(self.url) as conn:  # a transaction until the block ends
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (APPEND_LOCK,))
            self.locked.set()
            self.release.wait(self.seconds)

    def stop(self) -> None:
        self.release.set()
        self.join()


def test_pg_writer_waits_for_a_held_lock(pg_url: str) -> None:
    with open_store(pg_url) as s:
        holder = AppendLockHolder(pg_url, 0.3)
        t0 = time.perf_counter()
        assert s.append_one(NewEvent("run", "T", 1, "k", {}, "w")).seq == 1
        assert time.perf_counter() - t0 >= 0.2  # it waited instead of failing
        holder.stop()


def test_pg_lock_held_past_the_timeout_is_a_store_error(pg_url: str) -> None:
    with PostgresStore(pg_url, lock_timeout_s=0.05) as s:
        holder = AppendLockHolder(pg_url, 30.0)
        try:
            with pytest.raises(StoreError, match="stayed locked by another writer") as info:
                s.append_one(NewEvent("run", "T", 1, "k", {}, "w"))
            assert isinstance(info.value.__cause__, psycopg.errors.LockNotAvailable)
        finally:
            holder.stop()
        assert s.count() == 0
