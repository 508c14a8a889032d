"""Summarise tools/gate_cost.sh's runs: GPU seconds per candidate for the gate and rung 0, and the gate's
verdicts, per problem, commit (before/after) and sandbox level; JSON and a Markdown table in OUT_DIR.

    python3 tools/gate_cost.py OUT_DIR
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def summary(db: Path) -> dict:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = [(t, json.loads(p)) for t, p in con.execute("SELECT type, payload FROM events ORDER BY seq")]
    con.close()
    cost: dict[str, list[float]] = defaultdict(list)
    for t, p in rows:
        if t == "BudgetCharged":
            parts = p["action"].split("/")
            if parts[1] == "gate" or (parts[1] == "bench" and parts[-1] == "0"):
                cost[parts[1]].append(p["gpu_s"])
    failed = [f"{p['category']}: {p['detail'][:120]}" for t, p in rows if t == "GateFailed"]
    failed += [f"bench {p.get('category')}: {p['detail'][:120]}" for t, p in rows if t == "BenchmarkFailed"]
    # the reference beside each candidate over the reference alone in the judge (1: nothing slowed it)
    drift = [
        s["ref_median_s"] / s["ref_alone_median_s"]
        for t, p in rows
        if t == "RungBenchmarked"
        for s in p["shapes"]
        if s.get("ref_alone_median_s")
    ]
    passed = sum(t == "GatePassed" for t, _ in rows)
    return {
        "candidates": sum(t == "CandidateProposed" for t, _ in rows),
        "gate_passed": passed,
        "gate_failed": failed,
        "gate_gpu_s_per_candidate": statistics.fmean(cost["gate"]) if cost["gate"] else None,
        "rung0_gpu_s_per_candidate": statistics.fmean(cost["bench"]) if cost["bench"] else None,
        "gate_gpu_s": cost["gate"],
        "rung0_gpu_s": cost["bench"],
        "ref_beside_over_alone": sorted(round(d, 3) for d in drift),
    }


def main(out: Path) -> None:
    result = {}
    for db in sorted(out.glob("*.db")):
        label, level, problem = db.stem.split("_", 2)
        result.setdefault(problem, {})[f"{label}/{level}"] = summary(db)
    (out / "gate_cost.json").write_text(json.dumps(result, indent=1))
    columns = sorted({k for r in result.values() for k in r})
    lines = [
        "| problem | " + " | ".join(f"{c} gate s | {c} rung 0 s | {c} passed" for c in columns) + " |",
        "| --- |" + " --- | --- | --- |" * len(columns),
    ]
    for problem, r in sorted(result.items()):
        cells = []
        for c in columns:
            s = r.get(c)
            if s is None:
                cells += ["", "", ""]
                continue
            g, b = s["gate_gpu_s_per_candidate"], s["rung0_gpu_s_per_candidate"]
            cells += [f"{g:.3g}" if g is not None else "-", f"{b:.3g}" if b is not None else "-"]
            cells.append(f"{s['gate_passed']}/{s['candidates']}")
        lines.append(f"| {problem} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    (out / "gate_cost.md").write_text(table + "\n")
    print(table)
    for problem, r in sorted(result.items()):
        for c, s in r.items():
            for f in s["gate_failed"]:
                print(f"{problem} {c}: {f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
