"""Scoring: a candidate's score at a rung, and the verdict of an interleaved duel between two.

Pure functions of measured times; the policy ranks by them and the benchmarker records their verdicts.
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

from kernelbrain.core.events import ShapeTiming

NOISE_FLOOR = 0.01  # no timing is trusted to better than 1%, however small its measured IQR
TIE_MARGIN = 0.05  # an interleaved re-measurement must show more than 5% to rank one kernel over another
# ... and its pairs must lean one way more than identical kernels would once in a thousand duels
# (unanimity takes 11 pairs; 18 of 20 do)
SIGN_ALPHA = 0.001
# the fewest pairs a duel times: 12 of 12 clear the sign test (on a GPU the rungs ask for 20 or more;
# under the interpreter a pair of a slow kernel takes seconds)
DUEL_PAIRS = 12


def score(shapes: list[ShapeTiming]) -> float:
    """S(p, r): geometric-mean speedup over the rung's shapes, discounted by the candidate's spread.

    The stability term 1 / (1 + mean relative IQR) makes a noisy kernel rank below a steady one with
    the same median.
    """
    if not shapes:
        return 0.0
    geo = math.exp(statistics.fmean(math.log(max(s.speedup, 1e-12)) for s in shapes))
    spread = statistics.fmean(s.cand_iqr_s / s.cand_median_s if s.cand_median_s > 0 else 1.0 for s in shapes)
    return geo / (1.0 + spread)


def sign_test_p(ratios: list[float]) -> float:
    """Two-sided exact sign test: the chance that identical kernels, each pair's ratio as likely above 1
    as below, put at least this many of the pairs on one side. Free of the noise's size and shape."""
    below, above = sum(r < 1.0 for r in ratios), sum(r > 1.0 for r in ratios)
    n, k = below + above, min(below, above)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0


def adjudicate(ratios: list[float]) -> tuple[Literal["a", "b", "tie"], float, float, float]:
    """Verdict of an interleaved re-measurement from per-pair time ratios a/b: 'a' (a faster), 'b', or
    'tie' when the ratios' interquartile range holds 1, the median is within TIE_MARGIN of it, or the
    pairs are not lopsided enough to rule out chance (sign_test_p above SIGN_ALPHA).

    The margin is wide on purpose: two builds of the same kernel can differ by a few percent
    systematically (code placement, caches), and calling them different would be reporting noise.
    The margin alone is not enough where one timing wobbles by 10-20% (a loaded host): 20 pairs of
    identical kernels then put a median 5% off one with an IQR clear of it about once in a hundred
    duels; the sign test's false verdicts stay under SIGN_ALPHA however large the wobble."""
    q1, med, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    if q1 <= 1.0 <= q3 or abs(med - 1.0) < TIE_MARGIN or sign_test_p(ratios) > SIGN_ALPHA:
        return "tie", med, q1, q3
    return ("a" if med < 1.0 else "b"), med, q1, q3


# how much slower the reference may run beside a candidate than where no candidate ran, before it is
# the candidate's doing: more than DRIFT times its time alone, plus SLACK seconds a call. On a GPU each
# sample starts after a synchronise and an L2 flush in both processes, so only a slowed reference should
# move far (2x is a first bound, not yet measured on the H200: ShapeTiming.ref_alone_median_s records
# both). On the CPU the wall clock is no such measure: with the test suite's children on two cores, a
# 20 us reference was seen at a 28 ms median beside the interpreter, so only a gross slowdown counts
REFERENCE_DRIFT = {"cuda": 2.0, "cpu": 10.0}
REFERENCE_SLACK_S = {"cuda": 0.0, "cpu": 0.5}


def reference_moved(
    beside: float, beside_iqr: float, clean: float, clean_iqr: float, device: str
) -> float | None:
    """The factor by which the reference ran slower beside the candidate than alone, if past noise: past
    the device's bound, and the two middle halves apart. None where it did not move."""
    if clean <= 0:
        return None
    bound = REFERENCE_DRIFT.get(device, 10.0) * clean + REFERENCE_SLACK_S.get(device, 0.5)
    apart = beside - beside_iqr / 2 > clean + clean_iqr / 2
    return beside / clean if beside > bound and apart else None
