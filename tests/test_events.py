"""kernelbrain.core.events.decode refuses what it cannot read, naming it; so does `kb status`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kernelbrain.store import EventStore, NewEvent, StoredEvent

from kernelbrain.core.events import (
    CandidateProposed,
    EventError,
    GateFailed,
    GatePassed,
    RunConfig,
    RunFinished,
    decode,
)
from kernelbrain.runtime.runner import DEFAULT_RUNGS, start_run

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "tests" / "problems" / "softmax_small.py"


def stored(type_: str, payload: dict, *, version: int = 1, seq: int = 42) -> StoredEvent:
    return StoredEvent(
        seq=seq,
        run_id="r-test",
        type=type_,
        version=version,
        key=f"k{seq}",
        payload=payload,
        actor="test",
        subject=None,
        stage=None,
        ts=1.0,
    )


GATE_PASSED = {"candidate": "c0ffee", "seeds": 3, "max_abs_err": 1e-7, "max_rel_err": 1e-6, "tolerance": 1e-4}


def test_a_known_event_round_trips() -> None:
    event = GatePassed(**GATE_PASSED)
    new = event.to_new("r-test", "k", "test", subject="c0ffee")
    back = decode(stored(new.type, new.payload, version=new.version))
    assert back == event and isinstance(back, GatePassed)


def test_an_unknown_type_names_the_type_and_seq() -> None:
    with pytest.raises(EventError) as e:
        decode(stored("FutureThing", {"anything": 1}, seq=4711))
    msg = str(e.value)
    assert "FutureThing" in msg and "#4711" in msg
    assert len(msg.splitlines()) == 1


def test_a_newer_version_names_the_type_and_version() -> None:
    with pytest.raises(EventError) as e:
        decode(stored("GatePassed", GATE_PASSED, version=GatePassed.VERSION + 6, seq=7))
    msg = str(e.value)
    assert "GatePassed" in msg and f"version {GatePassed.VERSION + 6}" in msg and "#7" in msg
    assert len(msg.splitlines()) == 1


@pytest.mark.parametrize(
    ("type_", "payload", "field"),
    [
        (
            "GatePassed",
            {k: v for k, v in GATE_PASSED.items() if k != "max_abs_err"},
            "max_abs_err",
        ),  # missing
        (
            "GateFailed",
            {"candidate": "c", "category": "bogus", "detail": "d"},
            "category",
        ),  # not in the Literal
        (
            "RunFinished",
            {
                "basis": "not a number",
                "reason": "r",
                "winner": None,
                "winner_rung": None,
                "winner_score": None,
            },
            "basis",
        ),  # wrong type
        ("GatePassed", {**GATE_PASSED, "surprise": 1}, "surprise"),  # extra fields are forbidden
    ],
)
def test_a_malformed_payload_names_the_field(type_: str, payload: dict, field: str) -> None:
    with pytest.raises(EventError) as e:
        decode(stored(type_, payload, seq=99))
    msg = str(e.value)
    assert field in msg and type_ in msg and "#99" in msg
    assert len(msg.splitlines()) == 1


PROPOSED = {
    "candidate": "c1",
    "source": "b1",
    "parent": None,
    "generator": "expert",
    "family": "conv",
    "strategy": "gemm",
    "knobs": {"strategy": "gemm", "block_m": 128},
    "round": 0,
    "hint": "strategy axis gemm",
}


def test_a_candidates_plan_round_trips_and_an_older_log_without_one_decodes() -> None:
    """CandidateProposed.plan: each launch's stage, family, knobs, what it reads and writes; a log written
    before the field existed decodes with an empty plan."""
    plan = [
        {"stage": "prelude", "family": "pool", "knobs": {"block": 512}, "reads": ["x"], "writes": "kb_x"},
        {"stage": "head", "family": "conv", "knobs": {"block_m": 128}, "reads": ["kb_x", "self.conv.weight"],
         "writes": "kb_h"},
        {"stage": "tail", "family": "reduce", "knobs": {"split": 1}, "reads": ["kb_h"], "writes": "kb_h"},
    ]  # fmt: skip
    event = decode(stored("CandidateProposed", {**PROPOSED, "plan": plan}))
    assert isinstance(event, CandidateProposed)
    assert [(launch.stage, launch.family, launch.writes) for launch in event.plan] == [
        ("prelude", "pool", "kb_x"),
        ("head", "conv", "kb_h"),
        ("tail", "reduce", "kb_h"),
    ]
    new = event.to_new("r-test", "k", "test")
    assert decode(stored(new.type, new.payload)) == event
    older = decode(stored("CandidateProposed", PROPOSED))
    assert isinstance(older, CandidateProposed) and older.plan == []
    with pytest.raises(EventError, match=r"plan\.0\.stage"):
        decode(stored("CandidateProposed", {**PROPOSED, "plan": [{**plan[0], "stage": "middle"}]}))


def test_versions_up_to_the_current_one_decode() -> None:
    older = decode(stored("GateFailed", {"candidate": "c", "category": "nan", "detail": "d"}, version=1))
    assert isinstance(older, GateFailed)
    finished = {"basis": 3, "reason": "done", "winner": None, "winner_rung": None, "winner_score": None}
    assert isinstance(decode(stored("RunFinished", finished, version=RunFinished.VERSION)), RunFinished)


# --- through the CLI ----------------------------------------------------------------------------------


def kb(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KB_DB"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "kernelbrain", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def run_db(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "kb.db"
    config = RunConfig(generator="expert", device="cpu", max_candidates=1, rungs=DEFAULT_RUNGS["cpu"])
    with EventStore(db, create=True) as store:
        run_id = start_run(store, str(PROBLEM), config)
    return db, run_id


@pytest.mark.parametrize(
    ("type_", "version", "named"),
    [("FutureThing", 1, ["FutureThing"]), ("RunResumed", 9, ["RunResumed", "version 9"])],
)
def test_kb_status_refuses_an_event_it_cannot_read(
    run_db: tuple[Path, str], type_: str, version: int, named: list[str]
) -> None:
    db, run_id = run_db
    ok = kb("status", run_id, "--db", str(db), cwd=db.parent)
    assert ok.returncode == 0, ok.stderr  # the run is readable before the foreign event
    assert run_id in ok.stdout
    with EventStore(db, create=False) as store:
        store.append(
            [
                NewEvent(
                    run_id=run_id,
                    type=type_,
                    version=version,
                    key=f"{run_id}/future",
                    payload={"attempt": 1, "hardware": {}, "from": "the future"},
                    actor="kb-from-the-future",
                )
            ]
        )
        count = store.count()
    res = kb("status", run_id, "--db", str(db), cwd=db.parent)
    assert res.returncode != 0
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), res.stderr
    assert all(n in lines[0] for n in named), lines[0]
    assert "Traceback" not in res.stderr + res.stdout
    with EventStore(db, create=False) as store:
        assert store.count() == count
