"""Event-store throughput: single and batched appends (synchronous=FULL), fold speed, claim cycles.

Usage: python benchmarks/store_bench.py [--out benchmarks/results/store_bench.json]
       python benchmarks/store_bench.py --db postgresql://user@host/db [--out ...store_bench_postgres.json]
Writes the JSON and a Markdown table beside it (same stem, .md). With --db URL it compares that
PostgreSQL store with a SQLite file, side by side: appends/s from 1 and 16 writer processes, claim
latency with 16 claiming processes (and that no task was claimed twice), and a 100,000-event fold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, str(ROOT))

from kernelbrain.store import EventStore, NewEvent, Projection, Store, StoredEvent, mask, open_store  # noqa: E402
from kernelbrain.store.driver import sqlite3  # noqa: E402

SINGLE_N = 3_000
BATCH_SIZE = 1_000
FOLD_N = 100_000  # also the batched-append volume: 100 batches of 1,000


class CountingProjection(Projection):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def apply(self, event: StoredEvent) -> None:
        self.n += 1


def event(run_id: str, i: int) -> NewEvent:
    # A payload shaped like a small domain event (ids, a few numbers, a blob hash).
    payload = {"candidate": f"c{i % 97:04x}", "rung": i % 4, "median_ms": 0.125 * i, "blob": "ab" * 32}
    return NewEvent(run_id, "RungBenchmarked", 1, f"{run_id}:{i}", payload, "bench", f"c{i % 97}", i % 4)


def bench_single(store: EventStore) -> dict[str, Any]:
    t0 = time.perf_counter()
    for i in range(SINGLE_N):
        store.append_one(event("single", i))
    dt = time.perf_counter() - t0
    return {"events": SINGLE_N, "seconds": dt, "appends_per_s": SINGLE_N / dt}


def bench_batched(store: EventStore) -> dict[str, Any]:
    batches = [
        [event("batched", b * BATCH_SIZE + i) for i in range(BATCH_SIZE)] for b in range(FOLD_N // BATCH_SIZE)
    ]
    t0 = time.perf_counter()
    for batch in batches:
        store.append(batch)
    dt = time.perf_counter() - t0
    return {"events": FOLD_N, "batch": BATCH_SIZE, "seconds": dt, "events_per_s": FOLD_N / dt}


def bench_fold(store: EventStore) -> dict[str, Any]:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        p = store.fold(CountingProjection(), run_id="batched")
        times.append(time.perf_counter() - t0)
        assert p.n == FOLD_N, p.n
    return {
        "events": FOLD_N,
        "seconds_runs": times,
        "seconds_median": statistics.median(times),
        "events_per_s": FOLD_N / statistics.median(times),
    }


def bench_claims(store: EventStore, n: int = 1_000) -> dict[str, Any]:
    """claim + fenced complete, each its own transaction: the per-task overhead a worker pays."""
    t0 = time.perf_counter()
    for i in range(n):
        lease = store.claim(f"task{i}", "bench", 60.0)
        assert lease is not None
        store.append([event("claims", i)], fence=lease, complete=True)
    dt = time.perf_counter() - t0
    return {"tasks": n, "seconds": dt, "cycles_per_s": n / dt}


def domain_run(store: EventStore, run_id: str, n_events: int = FOLD_N) -> None:
    """A kb run of realistic shape: candidates proposed, claimed, gated, charged, measured, promoted."""
    from kernelbrain.core.events import (
        BudgetCharged,
        CandidateProposed,
        GatePassed,
        ProblemAnalysed,
        RunConfig,
        RungBenchmarked,
        RunStarted,
        ShapeTiming,
        TaskClaimed,
    )
    from kernelbrain.runtime.runner import DEFAULT_RUNGS

    cfg = RunConfig(rungs=DEFAULT_RUNGS["cuda"], max_candidates=10**6)
    batch = [
        RunStarted(
            problem_path="p.py", problem_name="p", problem_hash="0" * 64, config=cfg, hardware={}, versions={}
        ).to_new(run_id, f"{run_id}/started", "bench"),
        ProblemAnalysed(
            ops=[{"op": "softmax"}], families=["row_softmax"], flops=1.0, bytes=1.0, shapes=["a", "b"]
        ).to_new(run_id, f"{run_id}/analysis", "bench"),
    ]
    i = 0
    while len(batch) < n_events:
        cid = f"{i:016x}"
        t = ShapeTiming(
            shape="a",
            cand_median_s=1e-3 * (1 + i % 97),
            cand_iqr_s=1e-5,
            ref_median_s=2e-3,
            ref_iqr_s=1e-5,
            repeats=10,
            speedup=2 / (1 + i % 97),
        )
        for e, key in (
            (
                CandidateProposed(
                    candidate=cid,
                    source="0" * 64,
                    parent=None,
                    generator="expert",
                    family="f",
                    strategy="s",
                    knobs={"i": i},
                    round=0,
                    hint="h",
                ),
                "propose",
            ),
            (TaskClaimed(task=f"gate/{cid}", worker="w", token=1, deadline=0.0), "claim-gate"),
            (GatePassed(candidate=cid, seeds=3, max_abs_err=0.0, max_rel_err=0.0, tolerance=1e-4), "gate"),
            (BudgetCharged(action=f"gate/{cid}", role="gatekeeper", gpu_s=0.01, wall_s=0.01), "charge-gate"),
            (TaskClaimed(task=f"bench/{cid}/0", worker="w", token=1, deadline=0.0), "claim-bench"),
            (
                RungBenchmarked(candidate=cid, rung=0, shapes=[t], score=t.speedup, timer="cuda-events"),
                "bench",
            ),
            (
                BudgetCharged(action=f"bench/{cid}/0", role="benchmarker", gpu_s=0.1, wall_s=0.1),
                "charge-bench",
            ),
        ):
            batch.append(e.to_new(run_id, f"{run_id}/{key}/{cid}", "bench", subject=cid))
        i += 1
    for start in range(0, len(batch), BATCH_SIZE):
        store.append(batch[start : start + BATCH_SIZE])


def bench_scheduler(store: EventStore, run_id: str = "domain") -> dict | None:
    """Fold a 100k-event kb run into RunState, then time one scheduler decision on it."""
    try:
        from kernelbrain.core.policy import decision_key, policy_for
        from kernelbrain.core.state import RunState
    except ImportError:
        return None
    domain_run(store, run_id)
    folds = []
    for _ in range(3):
        t0 = time.perf_counter()
        state = store.fold(RunState(run_id), run_id=run_id)
        folds.append(time.perf_counter() - t0)
    # the first decision on this log promotes a third of every candidate at once: a burst no real run
    # sees; after it is recorded, each further decision is what the scheduler pays per poll
    t0 = time.perf_counter()
    burst = policy_for(1).decide(state)
    burst_s = time.perf_counter() - t0
    store.append([d.to_new(run_id, decision_key(run_id, d), "bench") for d in burst])
    store.fold(state, run_id=run_id)
    return {
        "fold_events": state.event_count,
        "fold_seconds_median": statistics.median(folds),
        "burst_decisions": len(burst),
        "burst_seconds": burst_s,
        **decision_latency(policy_for(state.config.policy_version), state, repeats=50),
    }


def decision_latency(policy: Any, state: Any, repeats: int) -> dict[str, Any]:
    """Time `decide` on a folded state: what the scheduler pays per poll once the burst is recorded."""
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


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "sqlite_driver": sqlite3.__name__,
        "sqlite_version": sqlite3.sqlite_version,
    }


def markdown(result: dict[str, Any]) -> str:
    m, r = result["machine"], result["results"]
    rows = [
        ("single appends (1 event/transaction)", f"{r['single']['appends_per_s']:,.0f} appends/s"),
        (f"batched appends ({BATCH_SIZE}/transaction)", f"{r['batched']['events_per_s']:,.0f} events/s"),
        (f"fold {FOLD_N:,} events (median of 3)", f"{r['fold']['seconds_median']:.3f} s"),
        ("claim + fenced complete", f"{r['claims']['cycles_per_s']:,.0f} cycles/s"),
        *(
            ()
            if r["scheduler"] is None
            else (
                (
                    f"fold a {r['scheduler']['fold_events']:,}-event kb run into RunState (median of 3)",
                    f"{r['scheduler']['fold_seconds_median']:.3f} s",
                ),
                (
                    f"first decision on it: {r['scheduler']['burst_decisions']:,} promotions at once",
                    f"{r['scheduler']['burst_seconds']:.3f} s",
                ),
                (
                    f"each later decision ({r['scheduler']['candidates']:,} candidates), median / max",
                    f"{r['scheduler']['decide_median_ms']:.2f} / {r['scheduler']['decide_max_ms']:.2f} ms",
                ),
            )
        ),
    ]
    lines = [
        "# Event store benchmark",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {m['cpu_count']} CPUs, {m['platform']}, Python {m['python']}, "
        f"SQLite {m['sqlite_version']} ({m['sqlite_driver']}); WAL, synchronous=FULL, file in a temp dir.",
        "",
        "| measure | result |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
    ]
    return "\n".join(lines)


# -- PostgreSQL beside SQLite: many processes at once ------------------------------------------------

WRITERS = (1, 16)
APPENDS_PER_WRITER = {1: 3_000, 16: 500}
CLAIMERS, CLAIM_TASKS = 16, 1_600


def _writer(db: str, name: str, n: int, tag: str, barrier: Any, out: Any) -> None:
    with open_store(db) as s:
        barrier.wait()
        t0 = time.perf_counter()
        for i in range(n):
            s.append_one(event(f"{tag}-{name}", i))  # keys unique to this round and process
        out.put(time.perf_counter() - t0)


def _claimer(db: str, name: str, run: str, barrier: Any, out: Any) -> None:
    """Claims every task it can (in its own random order), completing each; its claim latencies."""
    import random

    tasks = [f"{run}/task{j}" for j in range(CLAIM_TASKS)]
    random.Random(name).shuffle(tasks)
    won, won_s, all_s = [], [], []
    with open_store(db) as s:

        def claimed(new: Any, previous: Any) -> list[NewEvent]:
            payload = {"task": new.task, "owner": new.owner, "token": new.token}
            return [NewEvent(run, "TaskClaimed", 1, f"claim:{new.task}:{new.token}", payload, name)]

        barrier.wait()
        for task in tasks:
            t0 = time.perf_counter()
            lease = s.claim(task, name, 60.0, on_claim=claimed)
            dt = time.perf_counter() - t0
            all_s.append(dt)
            if lease is not None:
                won_s.append(dt)
                won.append(task)
                s.append([event(f"{run}-done", len(won) + 10**6 * int(name[1:]))], fence=lease, complete=True)
    out.put({"won": won, "won_s": won_s, "all_s": all_s})


def _processes(target: Any, db: str, n: int, *args: Any) -> tuple[list[Any], float]:
    """n processes running target(db, name, *args, barrier, queue) at once; their results, wall seconds."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(n + 1), ctx.Queue()
    procs = [ctx.Process(target=target, args=(db, f"p{k}", *args, barrier, out)) for k in range(n)]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    results = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    return results, wall


def compare_one(db: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in WRITERS:
        each = APPENDS_PER_WRITER[n]
        _, wall = _processes(_writer, db, n, each, f"w{n}-{time.time_ns()}")
        out[f"appends_{n}"] = {
            "writers": n,
            "events": n * each,
            "seconds": wall,
            "appends_per_s": n * each / wall,
        }
    run = f"claims-{time.time_ns()}"  # a store used before holds done tasks of earlier runs
    results, wall = _processes(_claimer, db, CLAIMERS, run)
    won = [t for r in results for t in r["won"]]
    with open_store(db) as s:
        claims = s.read(types=["TaskClaimed"], run_id=run)
        given = len(claims)
        twice = given - len({e.payload["task"] for e in claims})
        out["fold"] = bench_fold_of(s)
    out["claims"] = {
        "claimers": CLAIMERS,
        "tasks": CLAIM_TASKS,
        "won": len(won),
        "claimed_twice": twice + len(won) - len(set(won)),
        "claim_events": given,
        "won_median_ms": statistics.median(x for r in results for x in r["won_s"]) * 1e3,
        "attempt_median_ms": statistics.median(x for r in results for x in r["all_s"]) * 1e3,
        "seconds": wall,
    }
    assert out["claims"]["claimed_twice"] == 0 and len(set(won)) == CLAIM_TASKS, out["claims"]
    return out


def bench_fold_of(store: Store) -> dict[str, Any]:
    bench_batched(store)  # type: ignore[arg-type]
    return bench_fold(store)  # type: ignore[arg-type]


def compare(url: str) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="kb-store-bench-") as tmp:
        sqlite = compare_one(str(Path(tmp) / "b.db"))
    with open_store(url) as s:
        version = s.server_version()  # type: ignore[attr-defined]
    pg = compare_one(url)
    load = [load_before, os.getloadavg()[0]]
    return {"postgres": pg, "sqlite": sqlite, "server_version": version, "db": mask(url), "load_avg_1m": load}


def compare_markdown(result: dict[str, Any]) -> str:
    m, r = result["machine"], result["results"]
    pg, sq = r["postgres"], r["sqlite"]
    rows = [
        *(
            (f"appends/s, {n} writer process{'es' if n > 1 else ''} (1 event/transaction)", f"appends_{n}",
             "appends_per_s", "{:,.0f}")
            for n in WRITERS
        ),
        (f"claim latency, {CLAIMERS} claiming processes: median of won claims", "claims", "won_median_ms",
         "{:.2f} ms"),
        ("... median of every attempt (won or refused)", "claims", "attempt_median_ms", "{:.2f} ms"),
        (f"tasks claimed twice (of {CLAIM_TASKS:,})", "claims", "claimed_twice", "{}"),
        (f"fold {FOLD_N:,} events (median of 3)", "fold", "seconds_median", "{:.3f} s"),
    ]  # fmt: skip
    lines = [
        "# Event store: PostgreSQL beside SQLite",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: this {m['cpu_count']}-CPU machine (shared), {m['platform']}, Python {m['python']}. "
        f"PostgreSQL {r['server_version']} on the same machine over TCP (127.0.0.1), default durability "
        f"(fsync, synchronous_commit on); SQLite {m['sqlite_version']}, WAL, synchronous=FULL, a temp file. "
        "Writers and claimers are separate processes started together behind a barrier. The machine's "
        f"1-minute load average was {r['load_avg_1m'][0]:.1f} before and {r['load_avg_1m'][1]:.1f} after "
        "(other work shared its 2 CPUs): the numbers are this machine's, not a server's.",
        "",
        "| measure | PostgreSQL | SQLite |",
        "| --- | --- | --- |",
        *(f"| {label} | {fmt.format(pg[k][f])} | {fmt.format(sq[k][f])} |" for label, k, f, fmt in rows),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--db", default=None, help="a postgresql:// URL: compare that store with SQLite")
    args = ap.parse_args(argv)
    argv_shown = [mask(a) for a in (sys.argv[1:] if argv is None else argv)]
    if args.db is not None:
        result = {
            "command": shlex.join(["python", "benchmarks/store_bench.py", *argv_shown]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine(),
            "results": compare(args.db),
        }
        out = args.out or ROOT / "benchmarks" / "results" / "store_bench_postgres.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        out.with_suffix(".md").write_text(compare_markdown(result))
        print(compare_markdown(result))
        return result
    args.out = args.out or ROOT / "benchmarks" / "results" / "store_bench.json"
    with tempfile.TemporaryDirectory(prefix="kb-store-bench-") as tmp, EventStore(Path(tmp) / "b.db") as s:
        results = {
            "single": bench_single(s),
            "batched": bench_batched(s),
            "fold": bench_fold(s),
            "claims": bench_claims(s),
            "scheduler": bench_scheduler(s),
        }
    result = {
        "command": shlex.join(["python", "benchmarks/store_bench.py", *argv_shown]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
