"""A run recorded by an earlier kb must keep replaying to the same decisions.

tests/fixtures/softmax_run.db was written by `kb run tests/problems/softmax_small.py --max-candidates 8
--eta 2 --inprocess` (a run whose log holds a noise adjudication) and softmax_run.decisions.json lists the
decisions it recorded. If the scheduler's logic
changes, these tests fail: bump POLICY_VERSION and keep version 1 reachable instead of rewriting history.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from kernelbrain.store import EventStore

from kernelbrain.core import policy
from kernelbrain.core.events import DECISION_TYPES, Promoted, decode
from kernelbrain.core.policy import decision_key
from kernelbrain.views.replay import replay
from tests.kbcli import kb

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def recorded(tmp_path):
    db = tmp_path / "softmax_run.db"
    shutil.copy(FIXTURES / "softmax_run.db", db)  # opening may add -wal/-shm files: never beside the fixture
    expected = json.loads((FIXTURES / "softmax_run.decisions.json").read_text())
    return db, expected


def test_recorded_run_replays_to_the_same_decisions(recorded):
    db, expected = recorded
    r = kb("replay", expected["run_id"], "--db", str(db))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(expected['decisions'])} decisions agree with policy v1" in r.stdout


def test_every_recorded_decision_is_recomputed_from_its_prefix(recorded):
    db, expected = recorded
    with EventStore(db, create=False) as store:
        raws = store.read(run_id=expected["run_id"], types=list(DECISION_TYPES))
        assert store.count(run_id=expected["run_id"], type="Adjudicated") == 1
        report = replay(store, expected["run_id"])
    assert report.agrees and report.decisions == len(expected["decisions"])
    got = [(r.seq, r.type, decode(r).basis) for r in raws]
    assert got == [(d["seq"], d["type"], d["basis"]) for d in expected["decisions"]]


def test_a_changed_policy_is_caught(recorded, monkeypatch):
    db, expected = recorded

    class Greedier(policy.AshaPolicy):  # what an unversioned tweak of the rules would look like
        def _promotions(self, state, rung, basis, dropped):
            out = super()._promotions(state, rung, basis, dropped)
            return [p.model_copy(update={"keep": p.keep + 1}) if isinstance(p, Promoted) else p for p in out]

    monkeypatch.setitem(policy.POLICIES, 1, Greedier)
    with EventStore(db, create=False) as store:
        report = replay(store, expected["run_id"])
    assert not report.agrees
    assert any("Promoted" in d and "keep=" in d for d in report.divergences)


def test_a_decision_the_policy_never_made_is_caught(recorded):
    db, expected = recorded
    run_id = expected["run_id"]
    with EventStore(db, create=False) as store:
        first = next(decode(r) for r in store.read(run_id=run_id, types=["Promoted"]))
        forged = first.model_copy(update={"candidate": "0000forged000000"})
        assert isinstance(forged, Promoted)
        store.append([forged.to_new(run_id, decision_key(run_id, forged), "forger")])
    r = kb("replay", run_id, "--db", str(db))
    assert r.returncode == 1
    assert "DIVERGENCE" in r.stdout and "0000forged000000" in r.stdout
