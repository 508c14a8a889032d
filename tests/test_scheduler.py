"""The ASHA policy: promotions, budgets, stopping, determinism; each decision carries its numbers."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernelbrain.store import EventStore

from kernelbrain.core.events import (
    Adjudicated,
    AdjudicationRequested,
    BenchmarkFailed,
    Promoted,
    Pruned,
    RunFinished,
    ShapeTiming,
)
from kernelbrain.core.policy import decision_key, policy_for
from kernelbrain.core.scoring import SIGN_ALPHA, TIE_MARGIN, adjudicate, score, sign_test_p
from tests.runs import RUN, SyntheticRun, verdict


@pytest.fixture
def store():
    with EventStore(":memory:") as s:
        yield s


def finished_rung0(run: SyntheticRun, speedups: dict[str, float]) -> None:
    for cid, sp in speedups.items():
        run.propose(cid)
        run.gate(cid)
        run.bench(cid, 0, sp)


def test_promotes_top_third_with_its_numbers(store):
    run = SyntheticRun(store, eta=3, max_candidates=6)
    finished_rung0(run, {"a": 1.0, "b": 3.0, "c": 2.0, "d": 0.5, "e": 2.5, "f": 0.1})
    run.gen_done()
    decisions = run.decide()
    assert [type(d) for d in decisions] == [Promoted, Promoted]
    b, e = decisions
    assert (b.candidate, b.rank, e.candidate, e.rank) == ("b", 1, "e", 2)
    assert b.keep == 2 and b.rung_from == 0 and b.rung_to == 1
    assert b.threshold == e.score == pytest.approx(2.5)
    assert list(b.peers) == ["b", "e", "c", "a", "d", "f"]  # all finishers, best first


def test_v1_fewer_than_eta_promotes_the_best_one(store):
    run = SyntheticRun(store, eta=3, policy_version=1)
    finished_rung0(run, {"a": 1.0, "b": 2.0})
    (p,) = run.decide()
    assert isinstance(p, Promoted) and p.candidate == "b" and p.keep == 1


def test_v1_promotion_is_never_repeated_and_waits_for_more_peers(store):
    run = SyntheticRun(store, eta=3, policy_version=1)
    finished_rung0(run, {"a": 2.0})
    assert [d.candidate for d in run.schedule()] == ["a"]
    finished_rung0(run, {"b": 1.0, "c": 0.5})
    assert run.decide() == []  # 3 finished, keep 1, and a already holds that place
    finished_rung0(run, {"d": 9.0})
    assert [d.candidate for d in run.decide()] == ["d"]


def test_v2_promotes_fewer_than_eta_finishers_only_once_no_more_can_arrive(store):
    """Policy v2 (and v3, which keeps its rule): the top n // eta go up as results arrive; with fewer
    finishers than eta, the best one waits until nothing is left to generate, gate or measure at or below
    its rung."""
    run = SyntheticRun(store, eta=3, policy_version=2)
    assert run.state().config.policy_version == 2
    finished_rung0(run, {"a": 2.0, "b": 1.0})
    run.propose("c")  # proposed, not yet gated
    assert run.decide() == []  # round 0 not done, c not gated: more finishers may come
    run.gen_done(proposed=("a", "b", "c"))
    assert run.decide() == []  # c's gate is pending
    run.gate("c")
    assert run.decide() == []  # c's rung-0 measurement is pending
    run.bench("c", 0, 0.5)
    (p,) = run.schedule()  # three finishers: the top one, as in v1
    assert isinstance(p, Promoted) and p.candidate == "a" and p.keep == 1
    run.bench("a", 1, 2.0)  # the only finisher of rung 1, and nothing more can arrive there: up
    (p,) = run.schedule()
    assert (p.candidate, p.rung_from, p.keep) == ("a", 1, 1)


def test_v2_a_first_finisher_waits_for_the_gates_before_it_goes_up(store):
    run = SyntheticRun(store, eta=3)
    run.propose("a")
    run.propose("b")
    run.gen_done(proposed=("a", "b"))
    run.gate("a")
    run.bench("a", 0, 5.0)
    assert run.decide() == []  # b may still finish rung 0 ahead of a
    run.gate("b", ok=False)
    assert [d.candidate for d in run.decide()] == ["a"]  # b failed its gate: a is the best of all


def test_equal_scores_are_not_ranked_but_re_measured(store):
    run = SyntheticRun(store, eta=2)
    finished_rung0(run, {"z": 1.0, "y": 1.0})
    (req,) = run.schedule()
    assert isinstance(req, AdjudicationRequested)
    assert (req.rung, req.a, req.b, req.why) == (0, "y", "z", "promotion boundary")  # ties ordered by id
    assert run.decide() == []  # nobody is promoted on noise while the re-measurement is pending
    run.add(
        Adjudicated(
            rung=0,
            a="y",
            b="z",
            pairs=20,
            ratio_median=1.003,
            ratio_q1=0.98,
            ratio_q3=1.02,
            outcome="tie",
            timer="test",
        ),
        "adjudicate/0/y/z",
    )
    p1, p2 = run.decide()
    assert (p1.candidate, p1.rank, p2.candidate, p2.rank) == ("y", 1, "z", 2)
    assert p1.note.startswith("within noise of z") and p2.note.startswith("within noise of y")
    assert "not ranked on it, both promoted" in p1.note


def test_a_clear_re_measurement_swaps_the_boundary(store):
    run = SyntheticRun(store, eta=2)
    finished_rung0(run, {"a": 2.0, "b": 1.99})
    run.schedule()
    run.add(
        Adjudicated(
            rung=0,
            a="a",
            b="b",
            pairs=20,
            ratio_median=1.2,
            ratio_q1=1.15,
            ratio_q3=1.25,
            outcome="b",
            timer="test",
        ),
        "adjudicate/0/a/b",
    )
    (p,) = run.decide()
    assert p.candidate == "b" and p.rank == 1 and "beat a" in p.note


def test_scores_apart_by_more_than_their_spread_need_no_adjudication(store):
    run = SyntheticRun(store, eta=2)
    finished_rung0(run, {"a": 2.0, "b": 1.5})
    (p,) = run.decide()
    assert isinstance(p, Promoted) and p.candidate == "a"


def test_the_winner_is_adjudicated_against_the_runner_up(store):
    run = SyntheticRun(store, eta=2, max_candidates=2)
    for cid in ("a", "b"):
        run.propose(cid)
        run.gate(cid)
        run.bench(cid, 0, 1.0 if cid == "a" else 0.999)
    run.gen_done(proposed=("a", "b"))
    run.add(
        Adjudicated(
            rung=0,
            a="a",
            b="b",
            pairs=20,
            ratio_median=1.0,
            ratio_q1=0.99,
            ratio_q3=1.01,
            outcome="tie",
            timer="test",
        ),
        "adjudicate/0/a/b",
    )
    run.schedule()  # a and b both promoted (tie)
    for r in (1, 2):
        for cid in ("a", "b"):
            run.bench(cid, r, 1.0 if cid == "b" else 0.9995)
        if r == 1:
            (req,) = run.schedule()
            assert (req.rung, req.a, req.b) == (1, "b", "a")
            run.add(
                Adjudicated(
                    rung=1,
                    a="b",
                    b="a",
                    pairs=20,
                    ratio_median=1.0,
                    ratio_q1=0.99,
                    ratio_q3=1.01,
                    outcome="tie",
                    timer="test",
                ),
                "adjudicate/1/b/a",
            )
        assert [d.TYPE for d in run.schedule()] == (["Promoted", "Promoted"] if r == 1 else [])
    run.profile("a")
    run.profile("b")
    run.gen_done("mutate/a")
    run.gen_done("mutate/b")
    (req,) = run.schedule()
    assert isinstance(req, AdjudicationRequested) and req.why == "winner" and (req.a, req.b) == ("b", "a")
    run.add(
        Adjudicated(
            rung=2,
            a="b",
            b="a",
            pairs=20,
            ratio_median=1.1,
            ratio_q1=1.05,
            ratio_q3=1.15,
            outcome="b",
            timer="test",
        ),
        "adjudicate/2/b/a",
    )
    finish = run.decide()[-1]
    assert isinstance(finish, RunFinished) and finish.winner == "a" and "beat b" in finish.note


def test_adjudicate_calls_a_tie_when_the_ratios_straddle_one():
    assert adjudicate([0.97, 1.01, 1.02, 0.99, 1.0])[0] == "tie"
    assert adjudicate([1.03, 1.031, 1.029, 1.03])[0] == "tie"  # a consistent 3% is inside the tie margin
    assert adjudicate([0.5, 0.52, 0.49, 0.51] * 3)[0] == "a"
    assert adjudicate([1.5, 1.52, 1.49, 1.51] * 3)[0] == "b"


def test_adjudicate_wants_more_lopsided_pairs_than_chance_gives():
    # four pairs agreeing is what identical kernels do once in eight duels: no verdict on so few
    assert adjudicate([0.5, 0.52, 0.49, 0.51])[0] == "tie"
    assert adjudicate([0.5] * 10)[0] == "tie"  # unanimity of 10 happens by chance 1 in 512
    assert adjudicate([0.5] * 11)[0] == "a"
    # a CI duel of two identical kernels on a loaded host (median 0.92, IQR 0.86-0.97): 15 of 20 below
    wobbly = [0.80, 0.84, 0.85, 0.86, 0.87, 0.88, 0.89, 0.90, 0.91, 0.92]
    wobbly += [0.92, 0.93, 0.95, 0.96, 0.97, 1.01, 1.03, 1.05, 1.08, 1.12]
    outcome, median, _, q3 = adjudicate(wobbly)
    assert q3 < 1.0 and median < 1.0 - TIE_MARGIN and outcome == "tie"
    assert sign_test_p(wobbly) > SIGN_ALPHA
    lopsided = [r for r in wobbly if r < 1.0] + [0.90, 0.91, 0.93, 1.01, 1.02]
    assert adjudicate(lopsided)[0] == "a"  # 18 of 20 is past chance


def test_failed_gate_and_overbudget_candidates(store):
    run = SyntheticRun(store, eta=3, max_candidates=2)
    run.propose("a")
    run.gate("a", ok=False)
    run.propose("b")
    run.propose("c")  # third proposal with a budget of two
    decisions = run.decide()
    assert [(type(d), d.candidate) for d in decisions] == [(Pruned, "c")]
    assert "candidate budget of 2" in decisions[0].reason
    assert run.state().candidates["a"].terminal.startswith("gate failed")


def test_gpu_budget_stops_and_prunes_the_waiting_with_their_rank(store):
    run = SyntheticRun(store, eta=3, budget_gpu_s=10.0)
    finished_rung0(run, {"a": 1.0, "b": 2.0, "c": 3.0})
    run.schedule()  # c promoted
    run.charge(10.5)
    decisions = run.decide()
    finish = decisions[-1]
    assert isinstance(finish, RunFinished) and finish.reason.startswith("GPU budget spent")
    assert finish.winner == "c" and finish.winner_rung == 0
    pruned = {d.candidate: d for d in decisions if isinstance(d, Pruned)}
    assert set(pruned) == {"a", "b", "c"}
    assert pruned["a"].rank == 3 and pruned["a"].peers == pytest.approx({"c": 3.0, "b": 2.0, "a": 1.0})


def test_run_finishes_when_work_runs_out_and_winner_is_highest_rung(store):
    run = SyntheticRun(store, eta=2, max_candidates=2)
    finished_rung0(run, {"a": 5.0, "b": 1.0})
    run.gen_done(proposed=("a", "b"))
    assert [d.candidate for d in run.schedule()] == ["a"]
    run.bench("a", 1, 0.9)
    assert [d.candidate for d in run.schedule()] == ["a"]  # the only finisher of rung 1
    assert run.decide() == []  # a waits for rung 2
    run.bench("a", 2, 0.8)
    assert run.decide() == []  # a waits for its profile
    run.profile("a")
    decisions = run.decide()
    assert [type(d) for d in decisions] == [Pruned, RunFinished]
    assert decisions[0].candidate == "b" and decisions[0].rank == 2
    assert decisions[1].winner == "a" and decisions[1].winner_rung == 2
    assert "every candidate evaluated" in decisions[1].reason


def test_nothing_decided_while_work_is_pending(store):
    run = SyntheticRun(store)
    run.propose("a")  # not gated yet; round 0 not recorded as done
    assert run.decide() == []


def test_decide_is_a_pure_function_of_the_prefix(store):
    run = SyntheticRun(store, eta=3)
    finished_rung0(run, {"a": 1.0, "b": 3.0, "c": 2.0, "d": 4.0})
    first = run.decide()
    again = run.decide()
    assert first == again and first  # same log, same decisions, same numbers
    state = run.state()
    state2 = store.fold(type(state)(state.run_id), run_id=state.run_id, until=state.position)
    from kernelbrain.core.policy import policy_for

    assert policy_for(1).decide(state2) == first


def test_score_is_geomean_discounted_by_spread():
    steady = [
        ShapeTiming(
            shape=s, cand_median_s=1.0, cand_iqr_s=0.0, ref_median_s=r, ref_iqr_s=0, repeats=5, speedup=r
        )
        for s, r in (("a", 2.0), ("b", 8.0))
    ]
    assert score(steady) == pytest.approx(4.0)
    noisy = [t.model_copy(update={"cand_iqr_s": 0.5}) for t in steady]
    assert score(noisy) == pytest.approx(4.0 / 1.5)
    assert math.isclose(score([]), 0.0)


def test_token_budget_stops_the_run(store):
    from kernelbrain.core.events import BudgetCharged

    run = SyntheticRun(store, budget_tokens=1000)
    finished_rung0(run, {"a": 1.0})
    run.schedule()
    run.add(BudgetCharged(action="gen/round0", role="generator", tokens=1200), "budget/tokens")
    finish = run.decide()[-1]
    assert isinstance(finish, RunFinished) and finish.reason == "token budget spent (1200 of 1000)"


def test_wall_budget_counts_only_live_sessions(store):
    """Wall time is read from event timestamps: a pure function of the log, summed over sessions."""
    import time

    from kernelbrain.core.events import RunResumed

    run = SyntheticRun(store, budget_wall_s=0.5)
    run.propose("a")
    time.sleep(0.3)
    run.gate("a")
    state = run.state()
    assert 0.3 <= state.wall_s < 0.5
    assert run.decide() == []  # a waits for rung 0; 0.3 s of 0.5 spent
    time.sleep(1.0)  # the run was down: no events
    run.add(RunResumed(attempt=1, hardware={}), "resumed/1")
    assert run.state().wall_s < 0.5  # downtime does not count
    time.sleep(0.3)
    run.bench("a", 0, 2.0)
    decisions = run.decide()
    assert isinstance(decisions[-1], RunFinished), decisions
    assert decisions[-1].reason.startswith("wall-time budget spent")


def test_a_candidate_that_fails_higher_up_gives_its_place_back(store):
    from kernelbrain.core.events import BenchmarkFailed

    run = SyntheticRun(store, eta=3)
    finished_rung0(run, {"a": 3.0, "b": 2.0, "c": 1.0})
    run.gen_done()
    assert [d.candidate for d in run.schedule()] == ["a"]
    run.add(BenchmarkFailed(candidate="a", rung=1, category="runtime", detail="too big"), "bench/a/1")
    decisions = run.decide()
    assert [(type(d), d.candidate) for d in decisions] == [(Pruned, "a"), (Promoted, "b")]
    assert decisions[1].rank == 1 and decisions[1].n_peers == 2


def test_new_runs_record_the_current_policy_and_every_version_stays_reachable():
    from kernelbrain.core.events import RunConfig
    from kernelbrain.core.policy import POLICIES, POLICY_VERSION, policy_for
    from kernelbrain.runtime.runner import DEFAULT_RUNGS

    assert RunConfig(rungs=DEFAULT_RUNGS["cpu"]).policy_version == POLICY_VERSION == max(POLICIES)
    assert sorted(POLICIES) == list(range(1, POLICY_VERSION + 1))
    assert all(policy_for(v).version == v for v in POLICIES)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 7),
    eta=st.sampled_from([2, 3]),
    speed=st.lists(st.floats(0.5, 8.0), min_size=40, max_size=40),
    noise=st.lists(st.sampled_from([0.0, 0.05]), min_size=40, max_size=40),
    picks=st.lists(st.integers(0, 1_000), min_size=200, max_size=200),
    fail=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_the_run_ends_only_with_nothing_promotable_and_every_promotion_measured(
    n, eta, speed, noise, picks, fail
):
    """Issue 15 item 6, as a property over random runs (no budget): whatever order gates, rungs, duels,
    profiles and mutations finish in, the run ends only when every promoted candidate was measured at
    its new rung (or failed there) and every rung promoted its top max(1, n // eta) finishers."""
    with EventStore(":memory:") as store:
        run = SyntheticRun(store, eta=eta, max_candidates=n + 2)
        cids = [run.propose(f"c{i}") for i in range(n)]
        run.gen_done(proposed=tuple(cids))
        draws = iter(range(10_000))
        pick = iter(picks * 10)
        state = run.state()
        for _ in range(400):
            decided = policy_for(state.config.policy_version).decide(state)
            store.append([d.to_new(RUN, decision_key(RUN, d), "scheduler") for d in decided])
            store.fold(state, run_id=RUN)
            if state.finished is not None:
                break
            todo = (
                [("gen", t) for t in state.generation_tasks()]
                + [("gate", c.id) for c in state.gate_tasks()]
                + [("bench", (c.id, r)) for c, r in state.bench_tasks()]
                + [("duel", a) for a in state.adjudication_tasks()]
                + [("profile", c.id) for c in state.profile_tasks()]
            )
            assert todo or decided, "no task and no decision: the run is stuck"
            if not todo:
                continue
            kind, what = todo[next(pick) % len(todo)]
            i = next(draws) % 40
            if kind == "gen":
                new = (run.propose(f"m{i}-{what}"),) if fail[i] and len(state.candidates) < n + 2 else ()
                run.gen_done(what, proposed=new)
            elif kind == "gate":
                run.gate(what, ok=not (fail[i] and speed[i] < 1))
            elif kind == "bench":
                cid, rung = what
                if fail[i] and speed[i] > 7:
                    run.add(
                        BenchmarkFailed(candidate=cid, rung=rung, category="crash", detail="x"),
                        f"bench/{cid}/{rung}",
                    )
                else:
                    run.bench(cid, rung, speed[i], iqr=noise[i])
            elif kind == "duel":
                outcome = ("a", "b", "tie")[i % 3]
                run.add(
                    verdict(what.rung, what.a, what.b, outcome), f"adjudicate/{what.rung}/{what.a}/{what.b}"
                )
            else:
                run.profile(what)
            store.fold(state, run_id=RUN)
    assert state.finished is not None, "the run never finished"
    assert not any(b in state.finished.reason for b in ("GPU budget", "token budget", "wall-time budget"))
    for c in state.candidates.values():
        for p in c.promotions.values():
            failed_there = c.bench_failed is not None and c.bench_failed.rung == p.rung_to
            assert p.rung_to in c.results or failed_there, (
                f"{c.id} promoted to rung {p.rung_to}, never measured"
            )
    for rung in range(state.top_rung):
        finishers = [c for c in state.candidates.values() if rung in c.results and c.bench_failed is None]
        if finishers:
            promoted = [c for c in finishers if rung in c.promotions]
            assert len(promoted) >= max(1, len(finishers) // eta), (rung, len(finishers), len(promoted))


# --- policy v4: the GPU budget counts what held the device alone, and pays before a task starts -------


def test_v4_counts_only_what_held_the_device_alone(store):
    """A gate's or an analysis's busy time (shared with its neighbours on a pool) is not the run's GPU
    spend under v4; under v3 it was."""
    for version, spent in ((4, False), (3, True)):
        with EventStore(":memory:") as s:
            run = SyntheticRun(s, eta=3, budget_gpu_s=10.0, policy_version=version)
            finished_rung0(run, {"a": 1.0, "b": 2.0, "c": 3.0})
            run.charge(10.5, action="gate/a", alone=False)
            finish = [d for d in run.decide() if isinstance(d, RunFinished)]
            assert bool(finish) == spent, (version, finish)


def test_v4_starts_no_rung_the_budget_left_cannot_pay_for(store):
    run = SyntheticRun(store, eta=3, budget_gpu_s=10.0, max_candidates=3)
    finished_rung0(run, {"a": 1.0, "b": 2.0, "c": 3.0})
    run.gen_done(proposed=("a", "b", "c"))
    for cid in "abc":
        run.charge(2.5, action=f"bench/{cid}/0")  # 7.5 s of the 10 held alone
    state = run.state()
    assert state.device_s == pytest.approx(7.5) and state.estimate("bench/0") == pytest.approx(2.5)
    # rung 1 times 5 + 2 samples where rung 0 timed 3 + 2, on one shape: about 3.5 s, 2.5 s are left
    assert state.estimate("bench/1") == pytest.approx(2.5 * 7 / 5)
    assert [d.candidate for d in run.schedule()] == ["c"]  # promoted: the decision is the ladder's
    state = run.state()
    assert state.bench_tasks() == [] and [(k, round(v, 2)) for k, v in state.withheld()] == [("bench/1", 3.5)]
    finish = run.decide()[-1]
    assert isinstance(finish, RunFinished) and finish.winner == "c" and finish.winner_rung == 0
    assert "7.5 of 10 s" in finish.reason and "bench at rung 1) would take about 3.5 s" in finish.reason


def test_v4_starts_what_the_budget_left_pays_for(store):
    run = SyntheticRun(store, eta=3, budget_gpu_s=20.0, max_candidates=3)
    finished_rung0(run, {"a": 1.0, "b": 2.0, "c": 3.0})
    run.gen_done(proposed=("a", "b", "c"))
    for cid in "abc":
        run.charge(2.5, action=f"bench/{cid}/0")
    run.schedule()
    state = run.state()
    assert [(c.id, r) for c, r in state.bench_tasks()] == [("c", 1)] and state.withheld() == []
    assert not any(isinstance(d, RunFinished) for d in run.decide())


def test_max_profiles_profiles_the_best_finalists_only(store):
    run = SyntheticRun(store, eta=2, max_candidates=2, max_profiles=1)
    for cid, speed in (("a", 1.0), ("b", 2.0)):
        run.propose(cid)
        run.gate(cid)
        for rung in range(3):
            run.bench(cid, rung, speed)
    run.gen_done(proposed=("a", "b"))
    assert [c.id for c in run.state().profile_tasks()] == ["b"]  # the best at the top rung, alone
    run.profile("b")
    state = run.state()
    assert state.profile_tasks() == [] and [c.id for c in state.live()] == ["a"]
    unlimited = SyntheticRun(EventStore(":memory:"), eta=2, max_candidates=2)
    for cid in "ab":
        unlimited.propose(cid)
        unlimited.gate(cid)
        unlimited.bench(cid, 2, 1.0)
    assert {c.id for c in unlimited.state().profile_tasks()} == {"a", "b"}
