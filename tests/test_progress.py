"""Progress of a live run: plain lines in a pipe, JSON lines with --json, a rich panel in a terminal."""

from __future__ import annotations

import io
import json
import re
import sqlite3
from pathlib import Path

import pytest
from kernelbrain.store import EventStore, NewEvent
from rich.console import Console

from kernelbrain.core.state import RunState
from kernelbrain.views import progress
from kernelbrain.views.describe import QUIET_TYPES, status_dict
from tests.kbcli import SOFTMAX, kb
from tests.runs import SyntheticRun

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "softmax_run.db"
ANSI = re.compile(r"\x1b\[")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A private copy of the recorded softmax run: (db, run id)."""
    db = tmp_path_factory.mktemp("recorded") / "kb.db"
    db.write_bytes(FIXTURE.read_bytes())
    with EventStore(db, create=False) as store:
        (run_id,) = store.run_ids()
    return db, run_id


def fold(db: Path, run_id: str, until: int | None = None) -> RunState:
    with EventStore(db, create=False) as store:
        return store.fold(RunState(run_id), run_id=run_id, until=until)


# --- real runs through the CLI ---------------------------------------------------------------------


def test_a_run_in_a_pipe_prints_plain_lines(tmp_path: Path) -> None:
    db = tmp_path / "kb.db"
    r = kb("run", str(SOFTMAX), "--db", str(db), "--max-candidates", "1", "--inprocess")
    assert r.returncode == 0, r.stderr
    assert not ANSI.search(r.stdout), "no animation or colour outside a terminal"
    lines = r.stdout.splitlines()
    run_id = lines[0].removeprefix("run ")
    state = fold(db, run_id)
    assert state.finished is not None and state.finished.winner
    with EventStore(db, create=False) as store:
        shown = [e for e in store.read(run_id=run_id) if e.type not in QUIET_TYPES]
    # every event but claims and charges, once each, in log order
    assert [int(m.group(1)) for m in map(re.compile(r"  #(\d+) ").match, lines) if m] == [
        e.seq for e in shown
    ]
    assert f"  #{shown[0].seq} run started: softmax_small on cpu" in r.stdout
    assert "gate passed" in r.stdout and "rung 0 " in r.stdout
    # the closing summary (a slow machine also prints one every PLAIN_SUMMARY_EVERY_S before it)
    summary = [line for line in lines if line.startswith("  progress: ")][-1]
    assert summary.startswith("  progress: 1 proposed; gate 1 passed, 0 failed, 0 waiting; ")
    assert "measured per rung 1/1/1" in summary and "finalists 1" in summary
    assert "best batch_size=8,dim=200 " in summary and f"({state.finished.winner} rung 2)" in summary
    assert "candidates 1 of 1 (0 left)" in summary
    assert lines[-2] == f"run {run_id} finished: {state.finished.reason}"
    assert lines[-1].startswith(f"winner {state.finished.winner} at rung 2")


def _json_lines(stdout: str) -> list[dict]:
    lines = stdout.splitlines()
    assert lines, "no output"
    return [json.loads(line) for line in lines]  # every line parses on its own


def test_run_json_prints_every_event_then_the_result(tmp_path: Path) -> None:
    db = tmp_path / "kb.db"
    r = kb("run", str(SOFTMAX), "--db", str(db), "--max-candidates", "1", "--inprocess", "--json")
    assert r.returncode == 0, r.stderr
    objs = _json_lines(r.stdout)
    *events, last = objs
    assert {o["kind"] for o in events} == {"event"} and last["kind"] == "result"
    run_id = last["run_id"]
    with EventStore(db, create=False) as store:
        logged = store.read(run_id=run_id)
    assert [o["seq"] for o in events] == [e.seq for e in logged]
    assert {o["type"] for o in events} == {e.type for e in logged}
    assert {"RunStarted", "CandidateProposed", "GatePassed", "RungBenchmarked", "RunFinished"} <= {
        o["type"] for o in events
    }
    assert all(o["run_id"] == run_id for o in events)
    assert events[0]["type"] == "RunStarted" and events[0]["payload"]["problem_name"] == "softmax_small"
    finished = fold(db, run_id).finished
    assert finished is not None
    assert last["status"] == "finished" and last["reason"] == finished.reason
    assert last["winner"] == finished.winner and last["winner_rung"] == finished.winner_rung
    assert set(last["speedups"]) == {"batch_size=8,dim=200"}
    assert last["progress"]["proposed"] == 1 and last["progress"]["finished"] is True


def cut_before_the_end(fixture: Path, db: Path) -> tuple[str, int]:
    """A copy of the recorded run as if killed just before its final decisions (the Pruned and RunFinished
    batch): its events up to there and its blobs, written through the store. (run id, last seq kept)"""
    with EventStore(fixture, create=False) as src, EventStore(db, create=True) as dst:
        (run_id,) = src.run_ids()
        events = src.read(run_id=run_id)
        last = max(e.seq for e in events if e.type not in ("Pruned", "RunFinished"))
        blobs = sqlite3.connect(f"{fixture.as_uri()}?immutable=1", uri=True)
        try:
            for (data,) in blobs.execute("SELECT data FROM blobs"):
                dst.put_blob(data)
        finally:
            blobs.close()
        kept = [e for e in events if e.seq <= last]
        dst.append(
            [
                NewEvent(
                    run_id=e.run_id,
                    type=e.type,
                    version=e.version,
                    key=e.key,
                    payload=e.payload,
                    actor=e.actor,
                    subject=e.subject,
                    stage=e.stage,
                )
                for e in kept
            ]
        )
        return run_id, dst.last_seq(run_id)


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "plain"])
def test_resume_shows_only_what_the_session_adds(tmp_path: Path, as_json: bool) -> None:
    db = tmp_path / "kb.db"
    run_id, kept = cut_before_the_end(FIXTURE, db)
    r = kb("resume", run_id, "--db", str(db), "--inprocess", *(["--json"] if as_json else []))
    assert r.returncode == 0, r.stderr
    with EventStore(db, create=False) as store:
        added = store.read(after=kept, run_id=run_id)
    assert [e.type for e in added][:1] == ["RunResumed"] and added[-1].type == "RunFinished"
    if as_json:
        *events, last = _json_lines(r.stdout)
        assert [o["seq"] for o in events] == [e.seq for e in added]
        assert last["kind"] == "result" and last["status"] == "finished" and last["run_id"] == run_id
        assert last["winner"] == "2631602c44e7be1a"  # the recorded run's winner, decided again
    else:
        lines = r.stdout.splitlines()
        assert lines[0] == f"run {run_id} resumed at event #{added[0].seq}: 8 candidates, 5 unfinished"
        shown = [line for line in lines if line.startswith("  #")]
        assert shown == [progress.event_text(e) for e in added if e.type not in QUIET_TYPES]
        assert (
            lines[-2] == f"run {run_id} finished: candidate budget reached (8) and every candidate evaluated"
        )


# --- the views on a recorded run -------------------------------------------------------------------


@pytest.mark.parametrize("until", [6, 30, 60, None], ids=["early", "gating", "ladder", "finished"])
def test_the_snapshot_counts_what_status_counts(recorded: tuple[Path, str], until: int | None) -> None:
    state = fold(*recorded, until=until)
    snap, d = progress.snapshot(state), status_dict(state)
    c = d["candidates"]
    assert (snap.proposed, snap.gate_passed, snap.gate_failed) == (
        c["proposed"],
        c["gate_passed"],
        c["gate_failed"],
    )
    assert snap.gate_waiting == c["proposed"] - c["gate_passed"] - c["gate_failed"]
    assert (snap.pruned, snap.finalists, snap.measured) == (
        c["pruned"],
        c["finalists"],
        d["measured_at_rung"],
    )
    budgets = {b.name: b for b in snap.budgets}
    assert budgets["device"].used == pytest.approx(d["budget"]["gpu_s"], abs=1e-3)
    assert budgets["wall"].used == pytest.approx(d["budget"]["wall_s"], abs=1e-3)
    assert budgets["candidates"].used == c["proposed"] and budgets["candidates"].limit == 8
    assert snap.finished is (until is None)


def test_the_best_speedup_comes_from_the_highest_rung_that_measured_the_shape(tmp_path: Path) -> None:
    with EventStore(tmp_path / "kb.db", create=True) as store:
        run = SyntheticRun(store)
        for cid, x in (("a", 5.0), ("b", 2.0)):
            run.propose(cid)
            run.gate(cid)
            run.bench(cid, 0, x)
        assert [(b.candidate, b.rung, b.speedup) for b in progress.snapshot(run.state()).best] == [
            ("a", 0, 5.0)
        ]
        run.bench("b", 1, 1.5)  # more repeats at rung 1 outrank a rung-0 figure
        assert [(b.candidate, b.rung, b.speedup) for b in progress.snapshot(run.state()).best] == [
            ("b", 1, 1.5)
        ]


def test_budgets_say_what_is_left(tmp_path: Path) -> None:
    with EventStore(tmp_path / "kb.db", create=True) as store:
        run = SyntheticRun(store, budget_gpu_s=10, budget_tokens=1000, max_candidates=4)
        run.propose("a")
        run.charge(3.5)
        snap = progress.snapshot(run.state())
    budgets = {b.name: b for b in snap.budgets}
    assert (budgets["device"].used, budgets["device"].left) == (3.5, 6.5)
    assert (budgets["tokens"].used, budgets["tokens"].left) == (0, 1000)
    assert budgets["wall"].limit is None and budgets["wall"].left is None
    line = progress.summary_line(snap)
    assert "device 3.5 s of 10 s (6.5 s left)" in line
    assert "tokens 0 of 1000 (1000 left)" in line and "candidates 1 of 4 (3 left)" in line


def test_tokens_are_left_out_of_an_offline_run_without_a_token_budget(recorded: tuple[Path, str]) -> None:
    names = [b.name for b in progress.snapshot(fold(*recorded)).budgets]
    assert names == ["device", "wall", "candidates"]


def test_the_plain_view_follows_the_log_from_its_cursor(recorded: tuple[Path, str]) -> None:
    db, run_id = recorded
    out: list[str] = []
    with EventStore(db, create=False) as reader:
        view = progress.PlainView(reader, run_id, after=100, write=out.append, every_s=0)
        view(fold(db, run_id, until=110))
        view(fold(db, run_id))  # a later poll shows only what is new
        view.close()
        later = [e for e in reader.read(after=100, run_id=run_id) if e.type not in QUIET_TYPES]
    events = [line for line in out if line.startswith("  #")]
    assert events == [progress.event_text(e) for e in later]
    summaries = [line for line in out if line.startswith("  progress: ")]
    # one while it ran (every_s=0), one at close; none for the finished poll
    assert len(summaries) == 2 and "proposed" in summaries[0]


def test_the_json_view_writes_one_parseable_line_per_event(recorded: tuple[Path, str]) -> None:
    db, run_id = recorded
    out: list[str] = []
    with EventStore(db, create=False) as reader:
        progress.JsonView(reader, run_id, write=out.append)(fold(db, run_id))
        logged = reader.read(run_id=run_id)
    assert [json.loads(line)["seq"] for line in out] == [e.seq for e in logged]
    assert json.loads(out[0]) == progress.event_dict(logged[0])


def test_a_terminal_shows_event_lines_above_the_live_panel(recorded: tuple[Path, str]) -> None:
    db, run_id = recorded
    state = fold(db, run_id)
    console = Console(force_terminal=True, record=True, width=120, file=io.StringIO())
    with EventStore(db, create=False) as reader, progress.LiveView(reader, run_id, console=console) as view:
        view(state)
    text = console.export_text()
    assert ANSI.search(console.file.getvalue())  # a terminal gets styles and cursor moves
    assert "run started: softmax_small on cpu" in text and "run finished:" in text
    panel = text[text.rindex(f"run {run_id}: softmax_small on cpu, generator expert") :]
    for expected in (
        "8 proposed; gate 8 passed, 0 failed, 0 waiting",
        "rung 0: 8, rung 1: 5, rung 2: 3; pruned 5; finalists 3",
        "batch_size=8,dim=200  0.26x  2631602c44e7be1a rung 2",
        "6.5 s",
        "of 8, 0 left",
        f"{state.finished.reason}; winner {state.finished.winner}",
    ):
        assert expected in panel, expected


def test_render_of_a_run_in_flight(recorded: tuple[Path, str]) -> None:
    db, run_id = recorded
    console = Console(force_terminal=True, record=True, width=120, file=io.StringIO())
    console.print(progress.render(progress.snapshot(fold(db, run_id, until=8))))
    text = console.export_text()
    assert "none measured yet" in text and "finished" not in text
    assert "waiting" in text and "no limit" in text


def test_outside_a_terminal_the_view_is_plain(
    recorded: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, run_id = recorded
    monkeypatch.setenv("TERM", "dumb")  # even where pytest runs with -s in a terminal
    with EventStore(db, create=False) as reader:
        assert type(progress.make_view(reader, run_id)) is progress.PlainView
        assert type(progress.make_view(reader, run_id, as_json=True)) is progress.JsonView
        assert type(progress.make_view(reader, run_id, quiet=True)) is progress.View


def test_the_result_of_an_interrupted_session(recorded: tuple[Path, str]) -> None:
    db, run_id = recorded
    state = fold(db, run_id, until=60)
    out = progress.result(state, None)
    assert (out.status, out.reason, out.winner, out.speedups) == ("interrupted", None, None, {})
    assert out.progress.finished is False and out.progress.proposed == len(state.candidates)
    done = progress.result(fold(db, run_id), fold(db, run_id).finished)
    assert done.status == "finished" and done.speedups == {
        "batch_size=8,dim=200": pytest.approx(0.26, abs=0.005)
    }
