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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; appended, so an installed kb comes first
    sys.path.append(str(ROOT))


def winner(db: str, run_id: str) -> tuple[str, str, str, list[str], object]:
    """The run's problem hash and source, its winner's id, source and allowed torch classes, its state."""
    from kernelbrain.store import open_store

    from kernelbrain.runtime.runner import load_state

    with open_store(db, create=False, readonly=True) as store:
        state = load_state(store, run_id)
        assert state.started is not None and state.finished is not None, f"{run_id} has not finished"
        cid = state.finished.winner
        assert cid, f"{run_id} has no winner"
        problem = store.get_blob(state.started.problem_hash).decode()
        source = store.get_blob(state.candidates[cid].proposal.source).decode()
    ops = [c for c in state.candidates[cid].proposal.torch_ops if c in state.config.allow_torch]
    return state.started.problem_hash, problem, cid, source, (ops, state)


def duel(a: tuple[str, str], b: tuple[str, str], device: str, rung: int | None) -> dict:
    """The duel of A's winner against B's (each (database, run id)); its verdict as a dict."""
    from kernelbrain.core.protocol import DuelRequest, Fit
    from kernelbrain.core.scoring import DUEL_PAIRS, adjudicate
    from kernelbrain.runtime.sandbox import Sandbox

    hash_a, problem, cid_a, src_a, (ops_a, state) = winner(*a)
    hash_b, _, cid_b, src_b, (ops_b, _) = winner(*b)
    assert hash_a == hash_b, "the two runs are of different problems"
    top = state.config.rungs[len(state.config.rungs) - 1 if rung is None else rung]
    request = DuelRequest(
        problem_source=problem,
        device=device,
        fits=[Fit.model_validate(f) for f in state.analysis.fits] if state.analysis is not None else [],
        a_source=src_a,
        b_source=src_b,
        which=top.shapes,
        repeats=max(DUEL_PAIRS, 2 * top.repeats),
        warmup=top.warmup,
        a_torch_ops=ops_a,
        b_torch_ops=ops_b,
    )
    box = Sandbox(device)
    try:
        reply, _ = box.call(request, timeout_s=900, task="cross-duel", own_code=False)
    finally:
        box.close()
    outcome, med, q1, q3 = adjudicate(reply.ratios)
    return {"a": cid_a, "b": cid_b, "outcome": outcome, "ratio_median": med, "ratio_q1": q1, "ratio_q3": q3,
            "pairs": len(reply.ratios), "same": src_a == src_b}  # fmt: skip


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
