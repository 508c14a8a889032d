"""tools/cross_duel.py: two runs' winners of one problem dueled as the scheduler duels, through the real
sandbox on CPU. Here the recorded softmax run's winner against itself, from two copies of its database
(a pool's and a serial run's, as issue 36 compares them)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from kernelbrain.core.scoring import DUEL_PAIRS
from tools import cross_duel

RUN_DB = Path(__file__).parent / "fixtures" / "softmax_run.db"


def test_a_winner_against_itself_from_two_databases(tmp_path: Path) -> None:
    a, b = tmp_path / "pool.db", tmp_path / "serial.db"
    shutil.copy(RUN_DB, a)
    shutil.copy(RUN_DB, b)
    (run,) = [r for (r,) in sqlite3.connect(a).execute("SELECT DISTINCT run_id FROM events")]
    verdict = cross_duel.duel((str(a), run), (str(b), run), "cpu", rung=0)
    assert verdict["same"] and verdict["a"] == verdict["b"]
    assert verdict["outcome"] in ("a", "b", "tie") and verdict["pairs"] >= DUEL_PAIRS
    assert verdict["ratio_q1"] <= verdict["ratio_median"] <= verdict["ratio_q3"]
