"""Event-store throughput: single and batched appends (synchronous=FULL), fold speed, claim cycles.

Usage: python benchmarks/store_bench.py [--out benchmarks/results/store_bench.json]
Writes the JSON and a Markdown table beside it (same stem, .md).
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

from kernelbrain.store import EventStore, NewEvent, Projection, StoredEvent  # noqa: E402
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "store_bench.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kb-store-bench-") as tmp, EventStore(Path(tmp) / "b.db") as s:
        results = {
            "single": bench_single(s),
            "batched": bench_batched(s),
            "fold": bench_fold(s),
            "claims": bench_claims(s),
            "scheduler": bench_scheduler(s),
        }
    argv_shown = sys.argv[1:] if argv is None else argv
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
