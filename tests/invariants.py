"""What must hold of any run's log after any crash: checked by the pipeline and crash-loop tests."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from kernelbrain.store import open_store

from kernelbrain.core.events import decode
from kernelbrain.core.state import RunState
from kernelbrain.views.replay import replay

# one effect per identity: the same task must never have recorded two outcomes
EFFECT_GROUPS = {
    "ProblemAnalysed": "analysis",
    "CandidateProposed": "proposal",
    "GenerationDone": "generation",
    "GatePassed": "gate",
    "GateFailed": "gate",
    "RungBenchmarked": "bench",
    "BenchmarkFailed": "bench",
    "ProfileCaptured": "profile",
    "Promoted": "promotion",
    "Pruned": "prune",
    "RunFinished": "finish",
}


def effect_identity(raw) -> tuple | None:
    group = EFFECT_GROUPS.get(raw.type)
    if group is None:
        return None
    e = decode(raw)
    detail = getattr(e, "task", None) if group == "generation" else getattr(e, "rung_from", None)
    if group == "bench":
        detail = e.rung
    return (raw.run_id, group, getattr(e, "candidate", None), detail)


def read_exec_log(path: Path) -> list[tuple[float, str, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        ts, task, op = line.split(" ")
        out.append((float(ts), task, op))
    return out


def check_run(db: Path, run_id: str, exec_log: Path | None = None) -> RunState:
    with open_store(str(db), create=False) as store:
        state = store.fold(RunState(run_id), run_id=run_id)
        assert state.finished is not None, f"run {run_id} did not finish"
        unfinished = [c.id for c in state.candidates.values() if c.terminal is None]
        assert not unfinished, f"candidates not in a terminal state: {unfinished}"
        events = store.read(run_id=run_id)
        effects = Counter(i for i in (effect_identity(raw) for raw in events) if i is not None)
        doubled = [k for k, n in effects.items() if n > 1]
        assert not doubled, f"identities with two effects: {doubled}"
        report = replay(store, run_id)
        assert report.agrees, report.divergences
        if exec_log is not None:
            runs = read_exec_log(exec_log)
            done_at = {
                raw.key: raw.ts for raw in events if raw.type in ("RungBenchmarked", "BenchmarkFailed")
            }
            assert done_at, "no benchmark completed"
            for ts, task, op in runs:
                if op == "bench" and task in done_at:
                    assert ts <= done_at[task], f"{task} ran again after its result was recorded"
            per_task = Counter(task for _, task, op in runs if op == "bench")
            assert set(done_at) <= set(per_task), "a benchmark result without a recorded execution"
        return state
