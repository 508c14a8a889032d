"""Where a gate's and a rung's seconds go: a kb run's candidates gated again through one Sandbox, each
gate's steps timed (the judge's draws, the candidate's trial and its steps, the judge's launchers and
comparison, the whole gate with the worker's part), then, with --bench, each passing one timed at the
smallest rung (the child's seconds, the judge's clean reference timings and how many). A run's figures
per candidate are BudgetCharged's; this splits them.

    python3 tools/gate_phases.py RUN.db [--run ID] [--device cuda] [--limit 8] [--bench]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
from pathlib import Path

from kernelbrain.core.protocol import BenchRequest, GateRequest
from kernelbrain.runtime.sandbox import Sandbox, SandboxFault


def sources(db: Path, run: str = "") -> tuple[str, list[str]]:
    """The problem's source and the candidates' of the first run whose id holds `run`."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)

    def blob(h: str) -> str:
        return bytes(con.execute("SELECT data FROM blobs WHERE hash = ?", (h,)).fetchone()[0]).decode()

    ids = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM events ORDER BY seq") if run in r]
    query = "SELECT payload FROM events WHERE run_id = ? ORDER BY seq"
    rows = [json.loads(p) for (p,) in con.execute(query, (ids[0],))]
    started = next(r for r in rows if "problem_hash" in r)
    cands = [blob(r["source"]) for r in rows if "generator" in r and "source" in r]
    return blob(started["problem_hash"]), cands


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--run", default="", help="the run (a part of its id) where the file holds several")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--bench", action="store_true", help="and time each passing one at rung 0 (10, 3)")
    args = ap.parse_args()
    problem, cands = sources(args.db, args.run)
    box = Sandbox(args.device)
    phases: list[dict[str, float]] = []
    try:
        box.start_judge()
        box.start()
        for source in cands[: args.limit]:
            req = GateRequest(
                problem_source=problem, cand_source=source, device=args.device, seeds=args.seeds
            )
            reply, _ = box.call(req, timeout_s=600)
            fault = None
            phases.append(dict(box.gate_phases))
            if args.bench and reply.passed:
                rung = BenchRequest(
                    problem_source=problem,
                    cand_source=source,
                    device=args.device,
                    which="smallest",
                    repeats=10,
                    warmup=3,
                )
                fault = None
                try:
                    box.call(rung, timeout_s=600)
                except SandboxFault as e:  # a candidate's fault at the rung is a figure too
                    fault = str(e)
                phases[-1].update({f"rung0.{k}": v for k, v in box.bench_phases.items()})
            row = {"passed": reply.passed, **{k: round(v, 3) for k, v in phases[-1].items()}}
            print(json.dumps({**row, "rung0_fault": fault} if args.bench and fault else row))
    finally:
        box.close()
    later = phases[1:] or phases
    print(json.dumps({k: round(statistics.median(p.get(k, 0.0) for p in later), 3) for k in later[0]}))


if __name__ == "__main__":
    main()
