"""Two winners of the same problem, from two runs (two databases, or one), dueled as kb's scheduler
duels two candidates of one run: interleaved at the top rung of run A's config, both sides checked
like a rung, and the verdict `adjudicate` gives (a, b or tie) with the ratio's median and IQR. Issue
36's decision-quality check: where a pool's winner differs from a serial run's, whether it is a tie or
better.

    python3 tools/cross_duel.py DB_A RUN_A DB_B RUN_B [--device cuda] [--rung N]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; appended, so an installed kb comes first
    sys.path.append(str(ROOT))

if TYPE_CHECKING:
    from kernelbrain.core.state import RunState


@dataclass
class Winner:
    """A finished run's winner: its problem (hash and source), its id, its source and the classes of
    torch ops it may run, and the run's state."""

    problem_hash: str
    problem: str
    candidate: str
    source: str
    torch_ops: list[str]
    state: RunState


def winner(db: str, run_id: str) -> Winner:
    from kernelbrain.store import open_store

    from kernelbrain.runtime.role import Role
    from kernelbrain.runtime.runner import load_state

    with open_store(db, create=False, readonly=True) as store:
        state = load_state(store, run_id)
        assert state.started is not None and state.finished is not None, f"{run_id} has not finished"
        cid = state.finished.winner
        assert cid, f"{run_id} has no winner"
        problem = store.get_blob(state.started.problem_hash).decode()
        source = store.get_blob(state.candidates[cid].proposal.source).decode()
    return Winner(state.started.problem_hash, problem, cid, source, Role.torch_classes(state, cid), state)


def duel(a: tuple[str, str], b: tuple[str, str], device: str, rung: int | None) -> dict:
    """The duel of A's winner against B's (each (database, run id)), at `rung` of A's run (None: its
    top rung); its verdict as a dict."""
    from kernelbrain.core.scoring import adjudicate
    from kernelbrain.runtime.role import Role
    from kernelbrain.runtime.roles.benchmarker import duel_request
    from kernelbrain.runtime.sandbox import Sandbox

    wa, wb = winner(*a), winner(*b)
    assert wa.problem_hash == wb.problem_hash, "the two runs are of different problems"
    rungs = wa.state.config.rungs
    request = duel_request(
        wa.problem,
        device,
        Role.fits(wa.state),
        rungs[len(rungs) - 1 if rung is None else rung],
        (wa.source, wa.torch_ops),
        (wb.source, wb.torch_ops),
    )
    box = Sandbox(device)
    try:
        reply, _ = box.call(request, timeout_s=900, task="cross-duel", own_code=False)
    finally:
        box.close()
    outcome, med, q1, q3 = adjudicate(reply.ratios)
    return {"a": wa.candidate, "b": wb.candidate, "outcome": outcome, "ratio_median": med, "ratio_q1": q1,
            "ratio_q3": q3, "pairs": len(reply.ratios), "same": wa.source == wb.source}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db_a")
    ap.add_argument("run_a")
    ap.add_argument("db_b")
    ap.add_argument("run_b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rung", type=int, default=None, help="default: the top rung")
    args = ap.parse_args()
    print(json.dumps(duel((args.db_a, args.run_a), (args.db_b, args.run_b), args.device, args.rung)))


if __name__ == "__main__":
    main()
