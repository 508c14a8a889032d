"""Scheduler policy: asynchronous successive halving over the ladder, budgets, and stopping.

`decide(state)` is a pure function of a log prefix: the same folded state always gives the same
decisions, each carrying the numbers that made it, so `kb replay` can recompute and compare them.
A change of these rules must bump POLICY_VERSION and keep the old one reachable, or recorded runs
would replay to different decisions.
"""

from __future__ import annotations

import bisect
import math
import statistics
import time

from kernelbrain.events import Event, Promoted, Pruned, RunFinished, ShapeTiming
from kernelbrain.state import Candidate, RunState

POLICY_VERSION = 1
PEERS_SHOWN = 16  # a decision records the best peers (and the count): all of them would make a run O(n^2)


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


class AshaPolicy:
    """Version 1: promote the top 1/eta of a rung's finishers (at least the best one)."""

    version = 1

    def decide(self, state: RunState) -> list[Event]:
        if state.finished is not None or state.started is None:
            return []
        basis = state.position
        cfg = state.config
        spent = self._budget_spent(state)
        if spent:  # nothing more is worth promoting: stop now
            return self._finish(state, basis, spent)
        out: list[Event] = []
        for c in state.live():
            if c.ordinal >= cfg.max_candidates:
                out.append(
                    Pruned(
                        basis=basis,
                        candidate=c.id,
                        rung=-1,
                        reason=f"candidate budget of {cfg.max_candidates} already proposed",
                    )
                )
            elif c.bench_failed is not None:
                f = c.bench_failed
                out.append(
                    Pruned(
                        basis=basis,
                        candidate=c.id,
                        rung=f.rung,
                        reason=f"benchmark failed at rung {f.rung} ({f.category}): {f.detail}",
                    )
                )
        dropped = {p.candidate for p in out}
        for rung in range(state.top_rung):
            out += self._promotions(state, rung, basis, dropped)
        if out:
            return out
        reason = self._exhausted(state)
        return self._finish(state, basis, reason) if reason else []

    @staticmethod
    def _ranked(state: RunState, rung: int) -> tuple[list[tuple[float, str]], int, dict[str, float]]:
        """Everyone that finished `rung` as (-score, id), best first (ties by id, so arrival order never
        matters); how many ASHA keeps; and the best few as the peers a decision records."""
        ranking = state.ranking.get(rung, [])
        if state.bench_failures:  # a result discredited by a fault at a later rung holds no place
            ranking = [r for r in ranking if r[1] not in state.bench_failures]
        keep = max(1, len(ranking) // state.config.eta)
        return ranking, keep, {cid: -neg for neg, cid in ranking[:PEERS_SHOWN]}

    def _promotions(self, state: RunState, rung: int, basis: int, dropped: set[str]) -> list[Event]:
        ranking, keep, shown = self._ranked(state, rung)
        out: list[Event] = []
        for rank, (neg, cid) in enumerate(ranking[:keep], start=1):
            c = state.candidates[cid]
            if rung in c.promotions or c.terminal is not None or cid in dropped or c.bench_failed is not None:
                continue
            out.append(
                Promoted(
                    basis=basis,
                    candidate=cid,
                    rung_from=rung,
                    rung_to=rung + 1,
                    rank=rank,
                    peers=shown,
                    n_peers=len(ranking),
                    keep=keep,
                    threshold=-ranking[keep - 1][0],
                    score=-neg,
                )
            )
        return out

    @staticmethod
    def _budget_spent(state: RunState) -> str | None:
        cfg = state.config
        if cfg.budget_gpu_s is not None and state.gpu_s >= cfg.budget_gpu_s:
            return f"GPU budget spent ({state.gpu_s:.1f} of {cfg.budget_gpu_s:g} s)"
        if cfg.budget_tokens is not None and state.tokens >= cfg.budget_tokens:
            return f"token budget spent ({state.tokens} of {cfg.budget_tokens})"
        if cfg.budget_wall_s is not None and state.wall_s >= cfg.budget_wall_s:
            return f"wall-time budget spent ({state.wall_s:.0f} of {cfg.budget_wall_s:g} s)"
        return None

    @staticmethod
    def _exhausted(state: RunState) -> str | None:
        cfg = state.config
        if state.analysis is not None and state.analysis.error:
            return f"problem could not be analysed: {state.analysis.error}"
        if state.generation_tasks() or state.gate_tasks() or state.bench_tasks() or state.profile_tasks():
            return None  # work is pending; whoever waits unpromoted is pruned when the run stops
        if not state.candidates:
            note = state.generation.get("round0")
            return f"no candidates were proposed{': ' + note.note if note and note.note else ''}"
        if len(state.candidates) >= cfg.max_candidates:
            return f"candidate budget reached ({cfg.max_candidates}) and every candidate evaluated"
        return "search exhausted: no mutation left to try"

    def _finish(self, state: RunState, basis: int, reason: str) -> list[Event]:
        out: list[Event] = []
        for c in state.live():
            out.append(self._leftover(state, c, basis, reason))
        leader = state.leader()
        out.append(
            RunFinished(
                basis=basis,
                reason=reason,
                winner=leader.id if leader else None,
                winner_rung=max(leader.results) if leader else None,
                winner_score=leader.top_result.score if leader and leader.top_result else None,
            )
        )
        return out

    def _leftover(self, state: RunState, c: Candidate, basis: int, reason: str) -> Pruned:
        if not c.results:
            return Pruned(
                basis=basis, candidate=c.id, rung=-1, reason=f"run stopped before it was measured: {reason}"
            )
        rung = max(c.results)
        ranking, keep, shown = self._ranked(state, rung)
        rank = bisect.bisect_left(ranking, (-c.results[rung].score, c.id)) + 1
        return Pruned(
            basis=basis,
            candidate=c.id,
            rung=rung,
            rank=rank,
            peers=shown,
            n_peers=len(ranking),
            threshold=-ranking[keep - 1][0],
            score=c.results[rung].score,
            reason=f"run stopped with it at rung {rung}: {reason}",
        )


POLICIES = {AshaPolicy.version: AshaPolicy}


def policy_for(version: int) -> AshaPolicy:
    if version not in POLICIES:
        raise LookupError(f"this kb has no scheduler policy version {version}; upgrade kernelbrain")
    return POLICIES[version]()


def decision_latency_bench(state: RunState, repeats: int = 200) -> dict:
    """Time `decide` on a folded state (store_bench calls this)."""
    policy = policy_for(state.config.policy_version)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        policy.decide(state)
        times.append(time.perf_counter() - t)
    return {
        "decide_median_ms": statistics.median(times) * 1e3,
        "decide_max_ms": max(times) * 1e3,
        "candidates": len(state.candidates),
        "events": state.event_count,
    }
