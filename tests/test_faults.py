"""Faults from outside kb, each with real processes and a real database: a SQLite database made read-only
under a live run (chattr +i, as the tests run as root), a PostgreSQL server stopped mid-run and started
again, and an event a newer kb wrote. Each ends with one line saying what is wrong and whose fault it is,
the exit code README documents, and nothing recorded lost."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
from kernelbrain.store import EventStore, NewEvent, open_store

from kernelbrain.core.events import EVENT_TYPES, RunConfig
from kernelbrain.runtime.runner import DEFAULT_RUNGS, start_run
from kernelbrain.views.ending import EXIT_STORE
from tests.invariants import check_run
from tests.kbcli import SOFTMAX, kb, kb_env, kb_start

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "softmax_run.db"
QUICK = ["--device", "cpu", "--max-candidates", "3", "--ladder", "smallest:2:0,primary:2:0", "--quiet"]


def wait_for(
    db: str, run_id: str, types: tuple[str, ...], proc: subprocess.Popen, timeout: float = 240
) -> None:
    """Until the run's log holds an event of `types` (the run must still be going)."""
    deadline = time.monotonic() + timeout
    with open_store(db, readonly=True) as store:
        while not any(store.count(run_id=run_id, type=t) for t in types):
            assert proc.poll() is None, f"kb ended ({proc.returncode}) before {types}: {proc.communicate()}"
            assert time.monotonic() < deadline, f"no {types} within {timeout} s"
            time.sleep(0.1)


def chattr(flag: str, *paths: Path) -> None:
    subprocess.run(["chattr", flag, *map(str, paths)], check=True, capture_output=True)


def test_a_store_closed_after_its_files_turned_immutable_does_not_sigbus(tmp_path: Path) -> None:
    """SQLite's last connection to close checkpoints, writing the -shm file it maps; once that file is
    immutable, that write is a SIGBUS (the issue's `kb run`, rc -7). A write is refused with one line
    before SQLite touches anything, and the close leaves the WAL as it is."""
    script = (
        "import sys\n"
        "from kernelbrain.store import EventStore, NewEvent, StoreError\n"
        "ev = lambda k: NewEvent('r', 'T', 1, k, {}, 'a')\n"
        "s, t = EventStore(sys.argv[1]), EventStore(sys.argv[1])\n"
        "s.append([ev('one')])\n"
        "print('ready', flush=True)\n"
        "input()\n"  # the test makes the files immutable here
        "try:\n"
        "    s.append([ev('two')])\n"
        "except StoreError as e:\n"
        "    print(e)\n"
        "print(t.count())\n"
        "s.close(); t.close()\n"
        "print('closed')\n"
    )
    db = tmp_path / "kb.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kb_env(),
    )
    files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "ready\n", proc.communicate()
        chattr("+i", *files)
        out, err = proc.communicate("\n", timeout=60)
    finally:
        chattr("-i", *files)
    assert proc.returncode == 0, (proc.returncode, out, err)
    said = out.splitlines()
    why = "is read-only (a read-only mount, an immutable file or its mode); make it writable"
    assert said[0] == f"{db} cannot be written: {db} {why}"
    assert said[1:] == ["1", "closed"]
    with EventStore(db) as store:
        assert [e.key for e in store.read()] == ["one"]


def test_a_database_made_read_only_mid_run_ends_it_in_one_line(tmp_path: Path) -> None:
    """The database, its -wal and -shm and its folder made immutable while the run's workers write:
    `kb run` ends with one line naming the database and exit 6 (no SIGBUS, no worker blamed); made
    writable again, `kb resume` finishes the run with everything recorded before kept."""
    folder = tmp_path / "db"
    folder.mkdir()
    db = folder / "kb.db"
    env = kb_env(KB_EXEC_LOG=str(tmp_path / "exec.log"))
    proc, run_id = kb_start(["run", str(SOFTMAX), "--db", str(db), *QUICK], env)
    frozen = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), folder]
    try:
        wait_for(str(db), run_id, ("GatePassed", "GateFailed"), proc)
        with open_store(str(db), readonly=True) as store:
            before = [e.key for e in store.read(run_id=run_id)]
        chattr("+i", *frozen)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        chattr("-i", *frozen)
    assert proc.returncode == EXIT_STORE, (proc.returncode, out, err)
    assert "Traceback" not in err and "Error:" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"kb: run {run_id} stopped: its database failed ({db} cannot be written"), err
    assert last.endswith(f"once it is fixed: kb resume {run_id} (exit {EXIT_STORE})"), last
    r = kb("resume", run_id, "--db", str(db), "--quiet", env=env)
    assert r.returncode == 0, (r.stdout, r.stderr)
    state = check_run(db, run_id)
    with open_store(str(db), readonly=True) as store:
        after = [e.key for e in store.read(run_id=run_id)]
    assert after[: len(before)] == before and state.resumes


def _restart_later(server, down_s: float) -> float:
    """Stop the server (a fast shutdown: every connection cut), wait, start it again on its port; the
    seconds it was down."""
    pg_ctl = str(server.bin / "pg_ctl")
    server._run(pg_ctl, "-D", str(server.data), "-w", "-m", "fast", "stop")
    t0 = time.monotonic()
    time.sleep(down_s)
    settings = " ".join(f"-c {k}={v}" for k, v in server.settings.items())
    opts = f"-p {server.port} -k {server.dir} -c listen_addresses=127.0.0.1 {settings}"
    server._run(pg_ctl, "-D", str(server.data), "-l", str(server.log), "-w", "-o", opts, "start")
    return time.monotonic() - t0


def test_a_postgres_server_stopped_mid_run_is_one_line_each_way(pg_server, pg_url: str, tmp_path) -> None:
    """The server stopped for 8 s under a live `kb run` (its five workers included): the run rides it out
    and finishes; stderr says "the database is unavailable ...; trying again" once and "the database is
    back" once, and none of the connection pool's warnings (one a reconnection attempt)."""
    env = kb_env(KB_DB=pg_url, KB_EXEC_LOG=str(tmp_path / "exec.log"))
    proc, run_id = kb_start(["run", str(SOFTMAX), *QUICK], env)
    try:
        wait_for(pg_url, run_id, ("GatePassed", "GateFailed"), proc)
        down = _restart_later(pg_server, 8.0)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert down >= 8.0
    assert proc.returncode == 0, (out, err)
    lines = err.splitlines()
    lost = [line for line in lines if "the database is unavailable" in line]
    back = [line for line in lines if "the database is back after" in line]
    assert len(lost) == 1 and lost[0].startswith("kb: the database is unavailable ("), err
    assert lost[0].endswith("; trying again"), lost
    assert len(back) == 1 and back[0].startswith("kb: the database is back after "), err
    assert lines.index(lost[0]) < lines.index(back[0])
    assert not [line for line in lines if "psycopg" in line or "error connecting" in line], err
    assert pg_server.password not in err
    check_run(pg_url, run_id, tmp_path / "exec.log")


def _copy_with_a_newer_event(src: Path, db: Path) -> tuple[str, str, int]:
    """The fixture's finished run, and a copy of it under another id in which one gate verdict (midway)
    was written by a newer kb (its schema version one past this kb's); the two ids and that event's seq."""
    shutil.copyfile(src, db)
    with EventStore(db) as store:
        (old,) = store.run_ids()
        events = store.read(run_id=old)
        new = "r-newer-kb"
        gate = next(i for i, e in enumerate(events) if e.type == "GatePassed")
        copied = []
        for i, e in enumerate(events):
            payload = orjson_replace(e.payload, old, new)
            version = EVENT_TYPES[e.type].VERSION + 1 if i == gate else e.version
            key = e.key.replace(old, new)
            copied.append(NewEvent(new, e.type, version, key, payload, e.actor, e.subject, e.stage))
        stored = store.append(copied)
        return old, new, stored[gate].seq


def orjson_replace(payload: dict, old: str, new: str) -> dict:
    return orjson.loads(orjson.dumps(payload).replace(old.encode(), new.encode()))


def test_an_event_of_a_newer_kb_stops_replay_at_it_and_ls_lists_the_rest(tmp_path: Path) -> None:
    """One GatePassed of a newer schema version midway through a run: `kb replay` says so in one line and
    checks nothing past it (no spurious divergences after it), exit 1; `kb ls` lists the other run as
    before and marks this one unreadable, saying why, exit 0."""
    db = tmp_path / "kb.db"
    old, new, seq = _copy_with_a_newer_event(FIXTURE, db)
    r = kb("replay", new, "--db", str(db))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr == ""
    (line,) = r.stdout.splitlines()
    why = "has schema version 2, newer than this kb's 1; upgrade kernelbrain to read it ("
    assert line.startswith(f"replay stopped: event #{seq} (GatePassed) {why}"), line
    assert "decisions before it agree with policy" in line, line
    assert kb("replay", old, "--db", str(db)).returncode == 0

    r = kb("ls", "--db", str(db))
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["RUN", "PROBLEM", "STATE", "CANDIDATES", "BEST", "SCORE", "WINNER"]
    assert rows[0].startswith(old) and " finished " in rows[0]
    assert (
        rows[1].startswith(new) and f"unreadable: event #{seq} (GatePassed) has schema version 2" in rows[1]
    )
    listed = json.loads(kb("ls", "--db", str(db), "--json").stdout)
    assert [r["state"] for r in listed] == ["finished", "unreadable"]
    assert listed[1]["problem"] == listed[0]["problem"] and "upgrade kernelbrain" in listed[1]["error"]


def test_ls_columns_stay_apart_on_long_names(tmp_path: Path) -> None:
    """A problem name longer than any fixed column: every column still starts where its header does,
    two spaces at least after the one before."""
    db = tmp_path / "kb.db"
    shutil.copyfile(FIXTURE, db)
    long_name = "a_problem_name_far_longer_than_twenty_characters_" * 2
    problem = tmp_path / f"{long_name}.py"
    shutil.copyfile(SOFTMAX, problem)
    with EventStore(db) as store:
        start_run(store, str(problem), RunConfig(device="cpu", rungs=DEFAULT_RUNGS["cpu"]))
    r = kb("ls", "--db", str(db))
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    starts = [header.index(name) for name in ("PROBLEM", "STATE", "CANDIDATES", "BEST SCORE", "WINNER")]
    assert len(rows) == 2 and long_name in rows[1]
    for row in rows:
        for at in starts:
            assert row[at - 2 : at] == "  " and row[at] != " ", (row, at)
