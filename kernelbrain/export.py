"""`kb export`: the winner as a standalone module defining ModelNew (no kernelbrain import)."""

from __future__ import annotations

from pathlib import Path

from kernelbrain.runner import RunError
from kernelbrain.state import RunState
from store import EventStore


def export_source(store: EventStore, state: RunState, candidate: str | None = None) -> str:
    cid = (
        candidate
        or (state.finished.winner if state.finished else None)
        or (state.leader().id if state.leader() else None)
    )
    if cid is None:
        raise RunError(f"run {state.run_id} has no measured candidate to export yet")
    if cid not in state.candidates:
        raise RunError(f"run {state.run_id} has no candidate {cid!r}")
    c = state.candidates[cid]
    source = store.get_blob(c.proposal.source).decode()
    top = c.top_result
    numbers = (
        "; ".join(
            f"{s.shape}: {s.speedup:.3g}x ({s.cand_median_s:.3g} s vs {s.ref_median_s:.3g} s)"
            for s in top.shapes
        )
        if top
        else "not measured"
    )
    assert state.started
    header = (
        f"# Exported by kernelbrain from run {state.run_id}, problem {state.started.problem_name}.\n"
        f"# Candidate {cid} ({c.proposal.family}/{c.proposal.strategy}); best rung "
        f"{max(c.results) if c.results else '-'}: {numbers} [{top.timer if top else '-'}]\n"
    )
    return header + source


def export(store: EventStore, state: RunState, out: str | Path, candidate: str | None = None) -> Path:
    path = Path(out)
    try:
        path.write_text(export_source(store, state, candidate), encoding="utf-8")
    except OSError as e:
        raise RunError(
            f"cannot write {path}: {e.strerror}; pass -o a path in an existing, writable folder"
        ) from e
    return path
