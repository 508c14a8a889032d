"""How a batch (`kb run A.py B.py ...`) shows: a line as each of its runs ends, then a table of them all,
the device's timed share, and the batch's exit code (README): 0 when every problem's run finished (with
a kernel or not: each row says), EXIT_PROBLEM when a file was refused before its run could start (the
others finished), EXIT_WAITING when a run stopped with only parked tasks left, EXIT_INTERRUPTED when it
was stopped first; the last two are resumable with `kb resume BATCH`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kernelbrain.core.events import BudgetCharged, RunFinished, decode
from kernelbrain.core.policy import stalled
from kernelbrain.core.state import RunState
from kernelbrain.store import Store, StoredEvent
from kernelbrain.views import lines
from kernelbrain.views.ending import EXIT_INTERRUPTED, EXIT_PROBLEM, EXIT_WAITING


class Row(BaseModel):
    """One problem of the batch: its run (None: refused before one started) and how it ended."""

    problem: str
    run_id: str | None
    ended: bool
    winner: str | None = None
    speedups: dict[str, float] = {}
    outcome: str  # a few words: the winner's speedups, why there is none, or what it waits for
    candidates: int = 0
    device_s: float = 0.0  # what its GPU budget counts (RunState.device_s)


def row(state: RunState, finished: RunFinished | None) -> Row:
    """The row of a run, from its folded state and how supervise saw it end."""
    assert state.started is not None
    base = Row(
        problem=Path(state.started.problem_path).name,
        run_id=state.run_id,
        ended=finished is not None,
        outcome="",
        candidates=len(state.candidates),
        device_s=state.device_s,
    )
    if finished is None:
        why = "waiting: only parked tasks are left" if stalled(state) else "interrupted"
        return base.model_copy(update={"outcome": why})
    if finished.winner:
        top = state.candidates[finished.winner].top_result
        speedups = {s.shape: s.speedup for s in top.shapes} if top else {}
        text = ", ".join(f"{shape} {x:.3g}x" for shape, x in speedups.items())
        update = {"winner": finished.winner, "speedups": speedups, "outcome": f"winner: {text}"}
        return base.model_copy(update=update)
    if state.problem_fault:
        return base.model_copy(update={"outcome": f"the problem cannot be evaluated: {state.problem_fault}"})
    why = "no candidate proposed" if not state.candidates else "no candidate passed the gate and ladder"
    return base.model_copy(update={"outcome": f"no kernel: {why}"})


def refused(path: str, line: str) -> Row:
    return Row(problem=Path(path).name, run_id=None, ended=True, outcome=f"refused: {line}")


class BatchView:
    """supervise's progress callback for a batch: one line as each run ends (`[k/N] file: outcome`), and
    every `every_s` a line on the whole: runs ended and live, and the share of this session's wall time
    the device was held alone for timing (a CI log of a long batch still says where it stands)."""

    def __init__(
        self, total: int, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total = total
        self.said: set[str] = set()
        self.every_s, self.clock = every_s, clock
        self.began = clock()
        self.next_at = self.began + every_s
        self.timed_before: dict[str, float] = {}  # each run's timed seconds when this session first saw it
        self.states: dict[str, RunState] = {}

    def __call__(self, state: RunState, seen: int = 0) -> None:
        self.states[state.run_id] = state
        self.timed_before.setdefault(state.run_id, state.timed_s)
        if state.finished is not None and state.run_id not in self.said:
            self.said.add(state.run_id)
            r = row(state, state.finished)
            lines.echo(f"[{len(self.said)}/{self.total}] {r.problem}: {r.outcome} ({r.run_id})")
        if self.clock() >= self.next_at:
            self.next_at = self.clock() + self.every_s
            lines.echo(self.summary())

    def summary(self) -> str:
        live = [s for s in self.states.values() if s.finished is None]
        measured = sum(s.leader() is not None for s in live)
        timed = sum(s.timed_s - self.timed_before[rid] for rid, s in self.states.items())
        wall = max(self.clock() - self.began, 1e-9)
        return (
            f"batch: {len(self.said)} of {self.total} runs ended, {len(live)} live ({measured} measured); "
            f"device held alone for timing {timed:.0f} s of {wall:.0f} s ({100 * timed / wall:.0f}%)"
        )


def table(rows: list[Row]) -> list[str]:
    """The batch's rows as a plain table, widest problem name first column."""
    width = max((len(r.problem) for r in rows), default=7)
    out = [f"{'problem':<{width}}  {'run':<22}  {'cands':>5}  {'device s':>8}  outcome"]
    for r in rows:
        out.append(
            f"{r.problem:<{width}}  {r.run_id or '-':<22}  {r.candidates:>5}  {r.device_s:>8.1f}  {r.outcome}"
        )
    return out


def exit_code(rows: list[Row]) -> int:
    if any(not r.ended and r.outcome == "interrupted" for r in rows):
        return EXIT_INTERRUPTED
    if any(not r.ended for r in rows):
        return EXIT_WAITING
    if any(r.run_id is None for r in rows):
        return EXIT_PROBLEM
    return 0


def alone_spans(raws: Iterable[StoredEvent]) -> dict[str, list[tuple[float, float, str]]]:
    """Per device, the (from, to, task) spans timed tasks held its lock alone, in order of `from`."""
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for raw in raws:
        if raw.type != "BudgetCharged" or raw.version < 2:
            continue
        e = decode(raw)
        assert isinstance(e, BudgetCharged)
        if e.device is not None and e.alone_from is not None and e.alone_to is not None:
            spans.setdefault(e.device, []).append((e.alone_from, e.alone_to, e.action))
    return {d: sorted(s) for d, s in spans.items()}


def batch_status(store: Store, batch: str) -> dict[str, Any]:
    """`kb status BATCH`: each run's row (live ones: the best so far), the device's timed share from the
    batch's start to its last event, and the table as `kb run` prints it."""
    from kernelbrain.core.errors import RunError
    from kernelbrain.runtime.batch import batch_runs

    run_ids = batch_runs(store, batch)
    if not run_ids:
        raise RunError(f"no batch {batch!r} in {store.path}; `kb ls` lists the runs there")
    states = [store.fold(RunState(rid), run_id=rid) for rid in run_ids]
    rows = []
    for s in states:
        r = row(s, s.finished)
        leader = s.leader()
        if s.finished is None and leader is not None and leader.top_result is not None:
            best = ", ".join(f"{t.shape} {t.speedup:.3g}x" for t in leader.top_result.shapes)
            r = r.model_copy(update={"outcome": f"live: best so far {best} (rung {max(leader.results)})"})
        elif s.finished is None:
            r = r.model_copy(update={"outcome": f"live: {len(s.candidates)} proposed, none measured yet"})
        rows.append(r)
    since = min(s.started_ts for s in states)
    until = max(s.last_ts for s in states)
    return {
        "batch": batch,
        "runs": [r.model_dump() for r in rows],
        "ended": sum(s.finished is not None for s in states),
        "share": timed_share(store, run_ids, since, until),
        "table": table(rows),
    }


def alone_within(spans: list[tuple[float, float, str]], since: float, until: float) -> float:
    """The seconds of the spans (alone_spans') that fall between `since` and `until`."""
    return sum(max(0.0, min(b, until) - max(a, since)) for a, b, _ in spans)


def timed_share(store: Store, run_ids: list[str], since: float, until: float) -> str:
    """The devices' timed share of the batch's wall time, as a line (from the runs' BudgetCharged)."""
    chosen = set(run_ids)
    raws = [raw for raw in store.read(types=["BudgetCharged"]) if raw.run_id in chosen]
    parts = []
    for device, spans in alone_spans(raws).items():
        busy = alone_within(spans, since, until)
        wall = max(until - since, 1e-9)
        parts.append(f"{device} {busy:.1f} s of {wall:.1f} s ({100 * busy / wall:.0f}%)")
    return "device held alone for timing: " + ("; ".join(parts) if parts else "never")
