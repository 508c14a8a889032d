"""`kb db copy SRC DST RUN_ID`: a real run moved from SQLite to PostgreSQL and back, with its blobs and
leases, the same at every stop (status, replay, export); a second copy adds nothing; a destination
holding other events of the run is refused untouched; a bad URL is one line with the password masked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kernelbrain.store import open_store

from kernelbrain.core.events import RunResumed
from tests.kbcli import SOFTMAX, kb

QUICK = ["--device", "cpu", "--ladder", "smallest:3:1,primary:3:1", "--quiet", "--inprocess"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, str]:
    db = tmp_path_factory.mktemp("copy") / "src.db"
    r = kb("run", str(SOFTMAX), "--db", str(db), "--max-candidates", "2", *QUICK)
    assert r.returncode == 0, r.stderr
    return db, r.stdout.split()[1]


def seen(db: str, run_id: str, tmp_path: Path) -> tuple[dict, str, str]:
    """What kb shows of the run in db: its status, its replay line, its exported winner."""
    status = kb("status", run_id, "--db", db, "--json")
    replay = kb("replay", run_id, "--db", db)
    out = tmp_path / f"k{abs(hash(db))}.py"
    export = kb("export", run_id, "--db", db, "-o", str(out))
    assert status.returncode == replay.returncode == export.returncode == 0, status.stderr + replay.stderr
    return json.loads(status.stdout), replay.stdout, out.read_text()


def test_a_run_goes_to_postgres_and_back_unchanged(finished_run, pg_server, pg_url: str, tmp_path) -> None:
    src, run_id = finished_run
    back = tmp_path / "back.db"
    first = kb("db", "copy", str(src), pg_url, run_id)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"copied run {run_id} from {src} to postgresql://kb:***@127.0.0.1")
    assert "replay of" in first.stdout and "agrees" in first.stdout
    assert pg_server.password not in first.stdout + first.stderr
    r = kb("db", "copy", pg_url, str(back), run_id, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["copied"] > 10 and report["already"] == 0 and report["blobs"] >= 3  # problem, 2 sources
    want = seen(str(src), run_id, tmp_path)
    assert seen(pg_url, run_id, tmp_path) == want
    assert seen(str(back), run_id, tmp_path) == want
    with open_store(src, readonly=True) as a, open_store(back, readonly=True) as b:
        assert [(e.key, e.type, e.payload, e.actor, e.ts) for e in a.read(run_id=run_id)] == [
            (e.key, e.type, e.payload, e.actor, e.ts) for e in b.read(run_id=run_id)
        ]
        tasks = {e.payload["task"] for e in a.read(run_id=run_id, types=["TaskClaimed"])}
        assert tasks and all(a.lease(t).token == b.lease(t).token for t in tasks)
        assert all(a.is_done(t) == b.is_done(t) for t in tasks)
    again = kb("db", "copy", str(src), pg_url, run_id, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["copied"] == 0 and json.loads(again.stdout)["already"] == report["copied"]


def test_a_destination_holding_other_events_of_the_run_is_refused(finished_run, tmp_path) -> None:
    src, run_id = finished_run
    dst = tmp_path / "dst.db"
    assert kb("db", "copy", str(src), str(dst), run_id).returncode == 0
    with open_store(dst) as store:
        extra = RunResumed(attempt=1, hardware={}).to_new(run_id, f"{run_id}/resumed/1", "elsewhere")
        store.append([extra])
        before = store.last_seq()
    r = kb("db", "copy", str(src), str(dst), run_id)
    assert r.returncode == 1
    assert r.stderr.startswith(f"Error: {dst} already holds ") and "nothing copied" in r.stderr
    assert r.stderr.count("\n") == 1
    with open_store(dst, readonly=True) as store:
        assert store.last_seq() == before
    missing = kb("db", "copy", str(src), str(tmp_path / "x.db"), "no-such-run")
    assert missing.returncode == 1 and "no run 'no-such-run'" in missing.stderr


def test_an_unreachable_destination_is_one_line(finished_run) -> None:
    from tests.pg_server import free_port

    src, run_id = finished_run
    r = kb("db", "copy", str(src), f"postgresql://kb:pw-s3cret@127.0.0.1:{free_port()}/kb", run_id)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("Error: cannot reach the PostgreSQL server at postgresql://kb:***@127.0.0.1")
    assert "pw-s3cret" not in r.stderr
