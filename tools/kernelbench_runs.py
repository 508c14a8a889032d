"""What the sweep's database holds of its files (tools/kernelbench_sweep.py): each file's newest run, by
its source as it is or as `kb run --eval` records it, and what a run recorded: its end, families, gate
verdicts, winner or why none, the mode its reference ran in."""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Runs:
    """What the database holds of the sweep's files, from one read of it: each problem source's newest
    run (by the source's hash) and the runs that have finished."""

    newest: dict[str, str]
    finished: set[str]
    order: dict[str, int]  # each run's place in the database: the newest of two sources wins

    @classmethod
    def read(cls, db: Path) -> Runs:
        if not db.exists():
            return cls({}, set(), {})
        from kernelbrain.store import open_store

        from kernelbrain.core.events import decode

        newest: dict[str, str] = {}
        finished: set[str] = set()
        order: dict[str, int] = {}
        with open_store(str(db), create=False, readonly=True) as store:
            for raw in store.read(types=["RunStarted", "RunFinished"]):  # in order: the newest run last
                if raw.type == "RunStarted":
                    newest[decode(raw).problem_hash] = raw.run_id
                    order[raw.run_id] = len(order)
                else:
                    finished.add(raw.run_id)
        return cls(newest, finished, order)

    def run_for(self, path: Path) -> str | None:
        """The newest run of this exact file (its source as it is, or as `kb run --eval` records it)."""
        runs = [r for h in source_hashes(path) if (r := self.newest.get(h)) is not None]
        return max(runs, key=self.order.__getitem__, default=None)


@functools.cache
def source_hashes(path: Path) -> tuple[str, str]:
    """The hashes a run of this file records: of its source, and of its source in eval mode (--eval)."""
    from kernelbrain.core.problem import in_eval_mode, source_hash

    source = path.read_text()
    return source_hash(source), source_hash(in_eval_mode(source))


def run_for(db: Path, path: Path) -> str | None:
    """The newest run in the database of this exact file (same source), if any."""
    return Runs.read(db).run_for(path)


def refused_in_training(db: Path, path: Path) -> bool:
    run_id = run_for(db, path)
    return run_id is not None and needs_eval(db, run_id)


def state_of(db: Path, run_id: str) -> Any:
    """The run's state (kernelbrain's RunState), folded from the database read-only."""
    from kernelbrain.store import open_store

    from kernelbrain.runtime.runner import load_state

    with open_store(str(db), create=False, readonly=True) as store:
        return load_state(store, run_id)


def needs_eval(db: Path, run_id: str) -> bool:
    """Whether the run ended refused for drawing random numbers in training mode (dropout): the sweep runs
    its file again with --eval, and labels its row so."""
    from kernelbrain.core.problem import RANDOM_IN_TRAINING

    state = state_of(db, run_id)
    fault = state.problem_fault or ""
    return state.finished is not None and not state.config.eval_mode and fault.startswith(RANDOM_IN_TRAINING)


def in_eval(db: Path, run_id: str) -> bool:
    return bool(state_of(db, run_id).config.eval_mode)


def batch_of(db: Path, run_id: str) -> str | None:
    return state_of(db, run_id).config.batch


def matched(db: Path, run_id: str) -> bool:
    """Whether the run's analysis found a template family (a run before its family existed did not)."""
    analysis = state_of(db, run_id).analysis
    return bool(analysis and analysis.families)


def outcome(db: Path, run_id: str) -> dict[str, Any]:
    """What the run recorded: its end, the families, the gate's verdicts, the winner, or why none."""
    state = state_of(db, run_id)
    gates = [c.gate for c in state.candidates.values() if c.gate is not None]
    failed = collections.Counter(g.category for g in gates if g.TYPE == "GateFailed")
    passed = sum(g.TYPE == "GatePassed" for g in gates)
    fin = state.finished
    winner = fin.winner if fin else None
    a = state.analysis
    out = {
        "run_id": run_id,
        "finished": fin is not None,
        "reason": fin.reason if fin else "unfinished",
        "families": a.families if a else [],
        "mode": (a.mode or "eval") if a else None,  # the reference's: training, or eval (--eval, older)
        "ops": sorted({o["op"] for o in a.ops}) if a else [],
        "candidates": len(state.candidates),
        "gate_passed": passed,
        "gate_failed": dict(failed),
        "winner": winner,
        "winner_family": state.candidates[winner].proposal.family if winner else None,
        "winner_torch_ops": state.candidates[winner].proposal.torch_ops if winner else [],
        "gpu_s": state.gpu_s,  # its children's busy seconds (gates and analyses too)
        "device_s": state.device_s,  # what its GPU budget counted: the device held alone
        "wall_s": state.wall_s,
    }
    if state.problem_fault:
        out["miss"] = f"problem fault: {state.problem_fault}"
    elif fin is None:
        out["miss"] = "run unfinished"
    elif not state.candidates:
        note = state.generation.get("round0")
        out["miss"] = "no offline template" if note is None or "template" in note.note else note.note
    elif winner is None:
        benched = [c.bench_failed for c in state.candidates.values() if c.bench_failed is not None]
        out["bench_failed"] = dict(collections.Counter(b.category for b in benched))
        said = [f"gate {k} x{n}" for k, n in sorted(failed.items())]
        said += [f"benchmark {k} x{n}" for k, n in sorted(out["bench_failed"].items())]
        first = (benched[0].detail if benched else "").splitlines()[:1]
        out["miss"] = "every candidate failed: " + ", ".join(said) + (f" ({first[0][:120]})" if first else "")
    return out
