"""Run the expert generator on every seed problem on CPU (Triton interpreter) and summarise, per
problem, the gate-passing strategies and the profile-driven mutations (issue 4's "shown when done").

    python tools/cpu_six.py [--max-candidates 8] [--out benchmarks/results/cpu_six_problems]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; appended, so an installed kb (tools/device_env.sh) comes first
    sys.path.append(str(ROOT))

from kernelbrain.store import open_store  # noqa: E402

from kernelbrain.core.events import GatePassed  # noqa: E402
from kernelbrain.core.state import RunState  # noqa: E402


def summarise(db: Path, run_id: str) -> dict:
    with open_store(db, readonly=True) as store:
        state = store.fold(RunState(run_id), run_id=run_id)
    passed = [c for c in state.candidates.values() if isinstance(c.gate, GatePassed)]
    mutations = [
        {
            "candidate": c.id,
            "parent": c.proposal.parent,
            "diagnosis": c.proposal.diagnosis,
            "hint": c.proposal.hint,
        }
        for c in state.candidates.values()
        if c.proposal.parent
    ]
    winner = state.candidates.get(state.finished.winner) if state.finished and state.finished.winner else None
    return {
        "run_id": run_id,
        "finished": state.finished.reason if state.finished else None,
        "candidates": len(state.candidates),
        "gate_passed": len(passed),
        "gate_failed": {
            c.id: f"{c.gate.category}: {c.gate.detail}"
            for c in state.candidates.values()
            if c.gate is not None and not isinstance(c.gate, GatePassed)
        },
        "passing_strategies": sorted({c.proposal.strategy for c in passed}),
        "family": sorted({c.proposal.family for c in state.candidates.values()}),
        "mutations": mutations,
        "winner": winner.id if winner else None,
        "winner_knobs": winner.proposal.knobs if winner else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-candidates", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cpu_six_problems")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "six.db"
        for problem in sorted((ROOT / "benchmarks" / "problems").glob("*.py")):
            t0 = time.time()
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "kernelbrain",
                    "run",
                    str(problem),
                    "--db",
                    str(db),
                    "--device",
                    "cpu",
                    "--inprocess",
                    "--quiet",
                    "--max-candidates",
                    str(args.max_candidates),
                ],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            run_id = r.stdout.split()[1] if r.stdout.startswith("run ") else None
            results[problem.stem] = {
                **(summarise(db, run_id) if run_id else {"error": r.stderr[-500:]}),
                "wall_s": round(time.time() - t0, 1),
            }
            print(problem.stem, json.dumps(results[problem.stem])[:300], flush=True)
    command = shlex.join(["python", "tools/cpu_six.py", *sys.argv[1:]])
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "results": results}, indent=1))
    lines = [
        f"# Expert generator on the six seed problems, CPU (Triton interpreter)\n\nCommand: `{command}`\n",
        "| problem | family | candidates | gate-passing strategies | profile-driven mutations (diagnosis) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        muts = (
            "; ".join(f"{m['candidate']} ({', '.join(m['diagnosis'])})" for m in r.get("mutations", []))
            or "none"
        )
        lines.append(
            f"| {name} | {', '.join(r.get('family', []))} | {r.get('candidates', '-')} | "
            f"{', '.join(r.get('passing_strategies', [])) or 'none'} | {muts} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
