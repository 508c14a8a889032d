"""Noise adjudication through a real sandbox: identical kernels are never told apart; a real
difference is. (The scheduler's side is in test_scheduler.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbrain.core.protocol import DuelRequest
from kernelbrain.core.scoring import adjudicate
from kernelbrain.runtime.sandbox import Sandbox
from tests.kbcli import SOFTMAX

CANDIDATES = Path(__file__).parent / "candidates"
GOOD = (CANDIDATES / "good_softmax.py").read_text()
# the same kernel under another source hash: a different candidate to kb, identical work to the machine
TWIN = GOOD + "\n# an identical twin: only this comment differs\n"


def duel(box: Sandbox, a: str, b: str, repeats: int) -> list[float]:
    args = {
        "problem_source": SOFTMAX.read_text(),
        "a_source": a,
        "b_source": b,
        "device": "cpu",
        "which": "smallest",
        "repeats": repeats,
        "warmup": 2,
    }
    result = box.call(DuelRequest(**args), timeout_s=300)[0].model_dump()
    assert result["timer"] == "interpreter-wallclock"
    return result["ratios"]


@pytest.mark.exclusive  # wall-clock timings: another test's load beside them is noise they must not see
@pytest.mark.parametrize("attempt", range(5))
def test_identical_kernels_are_never_reported_as_different(box, attempt):
    ratios = duel(box, GOOD, TWIN, repeats=20)
    assert len(ratios) == 20
    outcome, median, q1, q3 = adjudicate(ratios)
    assert outcome == "tie", (median, q1, q3)


def test_a_real_difference_is_found(box):
    slow = (CANDIDATES / "slow.py").read_text()  # sleeps 0.4 s per call
    outcome, median, _, _ = adjudicate(duel(box, GOOD, slow, repeats=12))  # 11 pairs can be past chance
    assert outcome == "a" and median < 0.5
