"""Scheduler policy: asynchronous successive halving over the ladder, budgets, and stopping.

`decide(state)` is a pure function of a log prefix: the same folded state always gives the same
decisions, each carrying the numbers that made it, so `kb replay` can recompute and compare them.
A change of these rules must bump POLICY_VERSION and keep the old one reachable, or recorded runs
would replay to different decisions.
"""

from __future__ import annotations

import bisect
import statistics

from kernelbrain.core.errors import UnknownPolicy
from kernelbrain.core.events import (
    Adjudicated,
    AdjudicationRequested,
    Event,
    Promoted,
    Pruned,
    RunFinished,
)
from kernelbrain.core.scoring import NOISE_FLOOR
from kernelbrain.core.state import Candidate, RunState

POLICY_VERSION = 4  # new runs record it (RunConfig.policy_version's default); 1 to 3 replay older ones
PEERS_SHOWN = 16  # a decision records the best peers (and the count): all of them would make a run O(n^2)


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
        dropped = {p.candidate for p in out if isinstance(p, Pruned)}  # all of them, so far
        for rung in range(state.top_rung):
            out += self._promotions(state, rung, basis, dropped)
        if out:
            return out
        reason = self._exhausted(state)
        if reason is None:
            return []
        contest = self._winner_contest(state)
        if contest is not None:
            verdict = self._adjudication(state, *contest, basis, "winner")
            if isinstance(verdict, AdjudicationRequested):
                return [verdict]  # the best two are within noise: measure them side by side first
        return self._finish(state, basis, reason)

    @staticmethod
    def _ranked(state: RunState, rung: int) -> tuple[list[tuple[float, str]], dict[str, float]]:
        """Everyone that finished `rung` as (-score, id), best first (ties by id, so arrival order never
        matters), and the best few as the peers a decision records."""
        ranking = state.ranking.get(rung, [])
        if state.bench_failures:  # a result discredited by a fault at a later rung holds no place
            ranking = [r for r in ranking if r[1] not in state.bench_failures]
        return ranking, {cid: -neg for neg, cid in ranking[:PEERS_SHOWN]}

    def _keep(self, state: RunState, rung: int, n: int) -> int:
        """How many of a rung's n ranked finishers go up (v1: at least the best one, at once)."""
        return max(1, n // state.config.eta)

    def _ordered(
        self, state: RunState, rung: int, ranking: list[tuple[float, str]]
    ) -> list[tuple[float, str]]:
        """The order places are given in (v1, v2: by score alone)."""
        return ranking

    def _promotions(self, state: RunState, rung: int, basis: int, dropped: set[str]) -> list[Event]:
        ranking, shown = self._ranked(state, rung)
        ranking = self._ordered(state, rung, ranking)
        keep = self._keep(state, rung, len(ranking))
        if keep == 0 or not ranking:
            return []
        chosen = [(rank, cid, -neg, "") for rank, (neg, cid) in enumerate(ranking[:keep], start=1)]
        out: list[Event] = []
        if len(ranking) > keep:  # the boundary: is the last kept place really ahead of the first left out?
            (_, a), (_, b) = ranking[keep - 1], ranking[keep]
            pending = all(rung not in state.candidates[x].promotions for x in (a, b))
            if self._consults(state, rung, a, b, pending):
                verdict = self._adjudication(state, rung, a, b, basis, "promotion boundary")
                if isinstance(verdict, AdjudicationRequested):
                    out.append(verdict)
                if verdict is None or isinstance(verdict, AdjudicationRequested):
                    chosen.pop()  # a waits for the re-measurement
                elif verdict.outcome == "b":
                    chosen[-1] = (
                        keep,
                        b,
                        state.candidates[b].results[rung].score,
                        f"beat {a} in an interleaved re-measurement "
                        f"(time ratio {1 / verdict.ratio_median:.3g})",
                    )
                elif verdict.outcome == "a":
                    chosen[-1] = (*chosen[-1][:3], self._ahead_note(state, rung, a, b, verdict))
                else:
                    spread = (
                        f"(time ratio median {verdict.ratio_median:.3g}, IQR {verdict.ratio_q1:.3g}-"
                        f"{verdict.ratio_q3:.3g}): not ranked on it, both promoted"
                    )
                    chosen[-1] = (*chosen[-1][:3], f"within noise of {b} {spread}")
                    chosen.append(
                        (
                            keep + 1,
                            b,
                            state.candidates[b].results[rung].score,
                            f"within noise of {a} {spread}",
                        )
                    )
        threshold = -ranking[keep - 1][0] if ranking else 0.0
        for rank, cid, s, note in chosen:
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
                    threshold=threshold,
                    score=s,
                    note=note,
                )
            )
        return out

    def _ahead_note(self, state: RunState, rung: int, a: str, b: str, verdict: Adjudicated) -> str:
        return (
            f"confirmed ahead of {b} by an interleaved re-measurement (time ratio {verdict.ratio_median:.3g})"
        )

    def _consults(self, state: RunState, rung: int, a: str, b: str, pending: bool) -> bool:
        """Whether the boundary pair's duel decides who takes the last place (v1, v2: only while neither
        has gone up, so once b beat a and went up, a went up on its score too)."""
        return pending and self._within_noise(state, rung, a, b)

    @staticmethod
    def _spread(state: RunState, rung: int, cid: str) -> float:
        shapes = state.candidates[cid].results[rung].shapes
        rel = statistics.fmean(s.cand_iqr_s / s.cand_median_s if s.cand_median_s > 0 else 1.0 for s in shapes)
        return max(NOISE_FLOOR, rel)

    def _within_noise(self, state: RunState, rung: int, a: str, b: str) -> bool:
        """a ranks above b; do their score intervals (score x (1 -/+ relative IQR)) overlap?"""
        sa, sb = (state.candidates[x].results[rung].score for x in (a, b))
        return sa * (1 - self._spread(state, rung, a)) <= sb * (1 + self._spread(state, rung, b))

    def _adjudication(
        self, state: RunState, rung: int, a: str, b: str, basis: int, why: str
    ) -> Adjudicated | AdjudicationRequested | None:
        """The verdict on (a, b) at this rung: recorded, still awaited (None), or to be asked for."""
        key = (rung, a, b)
        if key in state.adjudicated:
            return state.adjudicated[key]
        if key in state.adjudications:
            return None
        ca, cb = state.candidates[a], state.candidates[b]
        return AdjudicationRequested(
            basis=basis,
            rung=rung,
            a=a,
            b=b,
            a_score=ca.results[rung].score,
            b_score=cb.results[rung].score,
            a_spread=self._spread(state, rung, a),
            b_spread=self._spread(state, rung, b),
            why=why,
        )

    @staticmethod
    def _budget_spent(state: RunState) -> str | None:
        cfg = state.config
        if cfg.budget_gpu_s is not None and state.device_s >= cfg.budget_gpu_s:  # v1-v3: gpu_s
            return f"GPU budget spent ({state.device_s:.1f} of {cfg.budget_gpu_s:g} s)"
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
        if state.problem_failed is not None:
            return f"problem failed at the {state.problem_failed.stage}: {state.problem_failed.error}"
        if state.pending():
            return None  # work is pending; whoever waits unpromoted is pruned when the run stops
        if state.parked() or state.parked_tasks():
            return None  # a passing fault (the generator's service, a dying worker): it waits for `kb resume`
        if not state.candidates:
            note = state.generation.get("round0")
            return f"no candidates were proposed{': ' + note.note if note and note.note else ''}"
        if len(state.candidates) >= cfg.max_candidates:
            return f"candidate budget reached ({cfg.max_candidates}) and every candidate evaluated"
        return "search exhausted: no mutation left to try"

    def _winner_contest(self, state: RunState) -> tuple[int, str, str] | None:
        """The best two at the highest rung reached, when their scores are within noise."""
        leader = state.leader()
        if leader is None:
            return None
        rung = max(leader.results)
        ranking, _ = self._ranked(state, rung)
        if len(ranking) < 2:
            return None
        (_, a), (_, b) = ranking[0], ranking[1]
        return (rung, a, b) if self._within_noise(state, rung, a, b) else None

    def _finish(self, state: RunState, basis: int, reason: str) -> list[Event]:
        out: list[Event] = []
        for c in state.live():
            out.append(self._leftover(state, c, basis, reason))
        leader = state.leader()
        note = ""
        contest = self._winner_contest(state)
        verdict = state.adjudicated.get(contest) if contest else None
        if verdict is not None:
            _, a, b = verdict.rung, verdict.a, verdict.b
            if verdict.outcome == "b":
                leader = state.candidates[b]
                note = (
                    f"beat {a} in an interleaved re-measurement (time ratio {1 / verdict.ratio_median:.3g})"
                )
            elif verdict.outcome == "a":
                note = (
                    f"confirmed ahead of {b} by an interleaved re-measurement "
                    f"(time ratio {verdict.ratio_median:.3g})"
                )
            else:
                note = (
                    f"within noise of {b} (time ratio median {verdict.ratio_median:.3g}, IQR "
                    f"{verdict.ratio_q1:.3g}-{verdict.ratio_q3:.3g}): the two are not ranked on it"
                )
        out.append(
            RunFinished(
                basis=basis,
                reason=reason,
                winner=leader.id if leader else None,
                winner_rung=max(leader.results) if leader else None,
                winner_score=leader.top_result.score if leader and leader.top_result else None,
                note=note,
            )
        )
        return out

    def _leftover(self, state: RunState, c: Candidate, basis: int, reason: str) -> Pruned:
        if not c.results:
            return Pruned(
                basis=basis, candidate=c.id, rung=-1, reason=f"run stopped before it was measured: {reason}"
            )
        rung = max(c.results)
        ranking, shown = self._ranked(state, rung)
        keep = max(1, len(ranking) // state.config.eta)  # the place a promotion needed
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


class PatientAshaPolicy(AshaPolicy):
    """Version 2: the top n // eta of a rung's n finishers go up; the best one alone only once no more
    candidates can reach the rung (nothing left to generate, gate or measure at or below it).

    Version 1 promoted a rung's first finisher at once, as the best of one, so the ladder spent its
    upper rungs on whichever candidates were gated first, good or not, while the rest were still being
    gated (docs/architecture.md, "Scheduler policy", names the run that showed it)."""

    version = 2

    def _keep(self, state: RunState, rung: int, n: int) -> int:
        if n // state.config.eta > 0:
            return n // state.config.eta
        waiting = (
            state.generation_tasks()
            or state.gate_tasks()
            or any(r <= rung for _, r in state.bench_tasks())
            or any(a.rung <= rung for a in state.adjudication_tasks())
        )
        return 0 if waiting or not n else 1


class DuelBoundPolicy(PatientAshaPolicy):
    """Version 3: a recorded duel at the boundary decides the last place for as long as that pair stands
    there. Under v2, once b had beaten a and gone up, the next decision no longer consulted the duel
    and promoted a on its score as well: a duel's loser went up, and could win the run."""

    version = 3

    def _consults(self, state: RunState, rung: int, a: str, b: str, pending: bool) -> bool:
        if (rung, a, b) in state.adjudicated or (rung, b, a) in state.adjudicated:
            return True
        return pending and self._within_noise(state, rung, a, b)

    def _adjudication(
        self, state: RunState, rung: int, a: str, b: str, basis: int, why: str
    ) -> Adjudicated | AdjudicationRequested | None:
        """As v2, but a pair measured the other way round (b, a) needs no second duel: its verdict, seen
        from a's side."""
        v = state.adjudicated.get((rung, b, a))
        if v is None:
            return super()._adjudication(state, rung, a, b, basis, why)
        flip = {"a": "b", "b": "a", "tie": "tie"}[v.outcome]
        return v.model_copy(
            update={
                "a": a,
                "b": b,
                "outcome": flip,
                "ratio_median": 1 / v.ratio_median,
                "ratio_q1": 1 / v.ratio_q3,
                "ratio_q3": 1 / v.ratio_q1,
            }
        )

    def _ahead_note(self, state: RunState, rung: int, a: str, b: str, verdict: Adjudicated) -> str:
        if (rung, b, a) in state.adjudicated:  # a ranked below b on score and beat it
            return f"beat {b} in an interleaved re-measurement (time ratio {verdict.ratio_median:.3g})"
        return super()._ahead_note(state, rung, a, b, verdict)

    def _ordered(
        self, state: RunState, rung: int, ranking: list[tuple[float, str]]
    ) -> list[tuple[float, str]]:
        """By score, but every duel's winner at this rung ahead of its loser, so a loser never takes a
        place (or a rank) before the candidate that beat it. Cycles of verdicts stop after n passes."""
        order = [cid for _, cid in ranking]
        verdicts = [
            (b, a) if v.outcome == "b" else (a, b)
            for (r, a, b), v in sorted(state.adjudicated.items())
            if r == rung and v.outcome != "tie" and a in order and b in order
        ]
        for _ in range(len(order)):
            moved = False
            for winner, loser in verdicts:
                if order.index(loser) < order.index(winner):
                    order.remove(winner)
                    order.insert(order.index(loser), winner)
                    moved = True
            if not moved:
                break
        negated = {cid: neg for neg, cid in ranking}
        return [(negated[cid], cid) for cid in order]


class TimedBudgetPolicy(DuelBoundPolicy):
    """Version 4: the GPU budget counts only what held the device alone (RunState.device_s: timing and
    profiling, what a run costs a shared pool), and no timed task starts that the budget left cannot
    pay for (RunState.affordable, on the most a task of its kind took): once only such tasks are left,
    the run ends on them. Under v3 every child's busy time counted, gates and analyses too (on a pool,
    slowed by their neighbours), and a rung started on the last second of the budget: three KernelBench
    files spent 79-103 GPU-s against 60."""

    version = 4

    @staticmethod
    def _budget_spent(state: RunState) -> str | None:
        cfg = state.config
        if spent := DuelBoundPolicy._budget_spent(state):
            return spent
        if cfg.budget_gpu_s is not None and not state.pending() and (withheld := state.withheld()):
            kind, cost = max(withheld, key=lambda w: (-w[1], w[0]))  # the cheapest it could not pay
            return (
                f"GPU budget spent ({state.device_s:.1f} of {cfg.budget_gpu_s:g} s): the next task "
                f"({kind.replace('/', ' at rung ') if kind.startswith(('bench', 'duel')) else kind}) "
                f"would take about {cost:.1f} s more"
            )
        return None


POLICIES = {p.version: p for p in (AshaPolicy, PatientAshaPolicy, DuelBoundPolicy, TimedBudgetPolicy)}


def policy_for(version: int) -> AshaPolicy:
    if version not in POLICIES:
        raise UnknownPolicy(f"this kb has no scheduler policy version {version}; upgrade kernelbrain")
    return POLICIES[version]()


def stalled(state: RunState) -> bool:
    """Unfinished with nothing left but parked tasks: no role has a task and the scheduler has nothing to
    decide (a promotion due is work to come). The run waits for `kb resume`."""
    if state.finished is not None or state.started is None or not (state.parked() or state.parked_tasks()):
        return False
    return not state.pending() and not policy_for(state.config.policy_version).decide(state)


def decision_key(run_id: str, d: Event) -> str:
    """The idempotency key of a decision: one per decision a log prefix can call for, so schedulers that
    decide the same thing concurrently append it once."""
    cand = getattr(d, "candidate", None)
    if d.TYPE == "Promoted":
        return f"{run_id}/promote/{cand}/{d.rung_from}"  # type: ignore[attr-defined]
    if d.TYPE == "Pruned":
        return f"{run_id}/prune/{cand}"
    if d.TYPE == "AdjudicationRequested":
        return f"{run_id}/adjudication-requested/{d.rung}/{d.a}/{d.b}"  # type: ignore[attr-defined]
    return f"{run_id}/finished"
