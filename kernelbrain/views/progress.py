"""What `kb run` and `kb resume` show while a run is live: one view of the run (Snapshot), three ways.

- PlainView: one line per event and a summary line now and then, for pipes and CI logs (no animation).
- LiveView: the same event lines scrolling above a rich panel that redraws in place, for a terminal.
- JsonView: one JSON object per event (every type), for machines; `kb events --json` prints the same.

Each view follows the log through its own cursor, so it is told nothing but the folded RunState
that `runner.supervise` hands its progress callback. The run's end is one RunResult, printed by the
CLI as text or as the last JSON line.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

import orjson
from pydantic import BaseModel
from rich.console import Console, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kernelbrain.core.events import GatePassed, RunFinished, decode
from kernelbrain.core.state import RunState
from kernelbrain.store import Store, StoredEvent
from kernelbrain.views import lines
from kernelbrain.views.describe import QUIET_TYPES, summary

PLAIN_SUMMARY_EVERY_S = 30.0  # a CI log of a long GPU run still says where it stands


class Best(BaseModel):
    """The best speedup measured so far at one shape."""

    shape: str
    speedup: float
    candidate: str
    rung: int


class Budget(BaseModel):
    name: str  # "device", "wall", "tokens", "candidates"
    unit: str  # "s" or ""
    used: float
    limit: float | None
    left: float | None


class Snapshot(BaseModel):
    run_id: str
    problem: str
    device: str
    generator: str
    events: int
    proposed: int
    gate_passed: int
    gate_failed: int
    gate_waiting: int
    measured: list[int]  # candidates measured at each rung
    pruned: int
    finalists: int
    bench_failed: int
    best: list[Best]  # per shape: the best at the highest rung that measured it (most repeats)
    budgets: list[Budget]
    finished: bool
    reason: str | None
    winner: str | None


def snapshot(state: RunState, now: float | None = None) -> Snapshot:
    """The run as folded so far; `now` advances the wall clock of a live run past its last event."""
    assert state.started is not None, "a run's first event is RunStarted"
    cfg = state.config
    passed = failed = pruned = finalists = 0
    measured = [0] * len(cfg.rungs)
    best: dict[str, Best] = {}
    for c in state.candidates.values():
        if c.gate is not None:
            if isinstance(c.gate, GatePassed):
                passed += 1
            else:
                failed += 1
        pruned += c.pruned is not None
        finalists += c.profile is not None
        for rung in sorted(c.results):
            measured[rung] += 1
            if c.bench_failed is not None:
                continue  # as in RunState.leader: a candidate that faulted on the ladder is out
            for s in c.results[rung].shapes:
                seen = best.get(s.shape)
                if seen is None or (rung, s.speedup) > (seen.rung, seen.speedup):
                    best[s.shape] = Best(shape=s.shape, speedup=s.speedup, candidate=c.id, rung=rung)
    wall = state.wall_s
    if now is not None and state.finished is None:
        wall += max(0.0, now - state.last_ts)

    def budget(name: str, unit: str, used: float, limit: float | None) -> Budget:
        left = None if limit is None else max(0.0, limit - used)
        return Budget(name=name, unit=unit, used=used, limit=limit, left=left)

    budgets = [
        budget("device", "s", state.device_s, cfg.budget_gpu_s),
        budget("wall", "s", wall, cfg.budget_wall_s),
        budget("candidates", "", len(state.candidates), cfg.max_candidates),
    ]
    if cfg.generator == "llm" or cfg.budget_tokens is not None or state.tokens:
        budgets.insert(2, budget("tokens", "", state.tokens, cfg.budget_tokens))
    return Snapshot(
        run_id=state.run_id,
        problem=state.started.problem_name,
        device=cfg.device,
        generator=cfg.generator,
        events=state.event_count,
        proposed=len(state.candidates),
        gate_passed=passed,
        gate_failed=failed,
        gate_waiting=len(state.candidates) - passed - failed,
        measured=measured,
        pruned=pruned,
        finalists=finalists,
        bench_failed=len(state.bench_failures),
        best=list(best.values()),
        budgets=budgets,
        finished=state.finished is not None,
        reason=state.finished.reason if state.finished else None,
        winner=state.finished.winner if state.finished else None,
    )


def _num(x: float) -> str:
    return f"{x:.0f}" if x == int(x) else f"{x:.1f}"


def _amount(x: float, unit: str) -> str:
    return f"{_num(x)} {unit}" if unit else _num(x)


def _budget_text(b: Budget) -> str:
    text = f"{b.name} {_amount(b.used, b.unit)}"
    if b.limit is None:
        return text
    return f"{text} of {_amount(b.limit, b.unit)} ({_amount(b.left or 0.0, b.unit)} left)"


def _best_text(b: Best) -> str:
    return f"{b.shape} {b.speedup:.3g}x ({b.candidate} rung {b.rung})"


def summary_line(s: Snapshot) -> str:
    """The snapshot as one plain line."""
    rungs = "/".join(map(str, s.measured))
    best = "; ".join(map(_best_text, s.best)) or "none yet"
    return (
        f"progress: {s.proposed} proposed; gate {s.gate_passed} passed, {s.gate_failed} failed, "
        f"{s.gate_waiting} waiting; measured per rung {rungs}; pruned {s.pruned}; finalists "
        f"{s.finalists}; best {best}; spent {', '.join(map(_budget_text, s.budgets))}"
    )


def render(s: Snapshot) -> RenderableType:
    """The snapshot as a rich panel (what a terminal shows below the scrolling event lines)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row(
        "candidates",
        f"{s.proposed} proposed; gate {s.gate_passed} passed, {s.gate_failed} failed, "
        f"{s.gate_waiting} waiting",
    )
    grid.add_row(
        "ladder",
        ", ".join(f"rung {r}: {n}" for r, n in enumerate(s.measured))
        + f"; pruned {s.pruned}; finalists {s.finalists}"
        + (f"; failed on the ladder {s.bench_failed}" if s.bench_failed else ""),
    )
    if s.best:
        best = Table.grid(padding=(0, 2))
        for b in s.best:
            speed = Text(f"{b.speedup:.3g}x", style="green" if b.speedup >= 1 else "yellow")
            best.add_row(b.shape, speed, f"{b.candidate} rung {b.rung}")
        grid.add_row("best speedup", best)
    else:
        grid.add_row("best speedup", "none measured yet")
    budgets = Table.grid(padding=(0, 2))
    for b in s.budgets:
        if b.limit is None:
            left = "no limit"
        else:
            left = f"of {_amount(b.limit, b.unit)}, {_amount(b.left or 0.0, b.unit)} left"
        budgets.add_row(b.name, _amount(b.used, b.unit), left)
    grid.add_row("budget", budgets)
    if s.finished:
        grid.add_row("finished", f"{s.reason}; winner {s.winner or 'none'}")
    title = f"run {s.run_id}: {s.problem} on {s.device}, generator {s.generator}"
    return Panel(grid, title=Text(title), title_align="left")


def event_dict(raw: StoredEvent) -> dict[str, Any]:
    """One event as the JSON object `kb run --json` and `kb events --json` print."""
    return {
        "kind": "event",
        "run_id": raw.run_id,
        "seq": raw.seq,
        "type": raw.type,
        "version": raw.version,
        "key": raw.key,
        "candidate": raw.subject,
        "rung": raw.stage,
        "actor": raw.actor,
        "ts": raw.ts,
        "payload": raw.payload,
    }


def event_text(raw: StoredEvent) -> str:
    return f"  #{raw.seq} {summary(decode(raw))}"


class RunResult(BaseModel):
    """How a supervised session ended: the last line `kb run --json` prints."""

    kind: Literal["result"] = "result"
    run_id: str
    status: Literal["finished", "interrupted"]
    reason: str | None
    winner: str | None
    winner_rung: int | None
    winner_score: float | None
    speedups: dict[str, float]  # the winner's at its top rung, per shape
    progress: Snapshot


def result(state: RunState, finished: RunFinished | None) -> RunResult:
    top = state.candidates[finished.winner].top_result if finished and finished.winner else None
    return RunResult(
        run_id=state.run_id,
        status="finished" if finished else "interrupted",
        reason=finished.reason if finished else None,
        winner=finished.winner if finished else None,
        winner_rung=finished.winner_rung if finished else None,
        winner_score=finished.winner_score if finished else None,
        speedups={s.shape: s.speedup for s in top.shapes} if top else {},
        progress=snapshot(state),
    )


def json_line(obj: Any) -> str:
    return orjson.dumps(obj).decode()


# --- views ---------------------------------------------------------------------------------------


class View:
    """Follows one run's log as supervise folds it; subclasses say how each event and the run show.

    Called as supervise's progress callback `(state, seen)`; `seen` is ignored: the view keeps its own
    cursor (`after`), so a view started on a resume shows only what this session adds.
    """

    def __init__(self, reader: Store, run_id: str, after: int = 0) -> None:
        self.reader = reader
        self.run_id = run_id
        self.after = after
        self.state: RunState | None = None

    def __call__(self, state: RunState, seen: int = 0) -> None:
        self.state = state
        if state.position > self.after:
            for raw in self.reader.read(after=self.after, run_id=self.run_id, until=state.position):
                self.after = raw.seq
                self.event(raw)
        self.update(state)

    def event(self, raw: StoredEvent) -> None:
        pass

    def update(self, state: RunState) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> View:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PlainView(View):
    def __init__(
        self,
        reader: Store,
        run_id: str,
        after: int = 0,
        write: Callable[[str], None] = lines.echo,
        every_s: float = PLAIN_SUMMARY_EVERY_S,
    ) -> None:
        super().__init__(reader, run_id, after)
        self.write = write
        self.every_s = every_s
        self._last = time.monotonic()

    def event(self, raw: StoredEvent) -> None:
        if raw.type not in QUIET_TYPES:
            self.write(event_text(raw))

    def update(self, state: RunState) -> None:
        if time.monotonic() - self._last >= self.every_s and state.finished is None:
            self._last = time.monotonic()
            self.write("  " + summary_line(snapshot(state)))

    def close(self) -> None:
        if self.state is not None and self.state.started is not None:
            self.write("  " + summary_line(snapshot(self.state)))


class JsonView(View):
    def __init__(
        self, reader: Store, run_id: str, after: int = 0, write: Callable[[str], None] = lines.echo
    ) -> None:
        super().__init__(reader, run_id, after)
        self.write = write

    def event(self, raw: StoredEvent) -> None:
        self.write(json_line(event_dict(raw)))


class LiveView(View):
    """Event lines print above a panel that rich redraws in place (4 times a second, ticking wall)."""

    def __init__(self, reader: Store, run_id: str, after: int = 0, console: Console | None = None) -> None:
        super().__init__(reader, run_id, after)
        self.console = console or Console()
        self._snap: Snapshot | None = None
        self._at = time.time()
        self.live = Live(
            console=self.console, get_renderable=self._renderable, refresh_per_second=4, transient=False
        )

    def __enter__(self) -> LiveView:
        self.live.start()
        return self

    def _renderable(self) -> RenderableType:
        snap = self._snap  # set by the main thread; rich's refresh thread only reads it
        if snap is None:
            return Text(f"run {self.run_id}: waiting for its first events")
        if not snap.finished:  # the wall clock keeps moving between events
            snap = _advance_wall(snap, time.time() - self._at)
        return render(snap)

    def event(self, raw: StoredEvent) -> None:
        if raw.type not in QUIET_TYPES:
            # Text, not markup: details such as "[compile]" are not rich styles
            self.live.console.print(Text(event_text(raw)), soft_wrap=True)

    def update(self, state: RunState) -> None:
        if state.started is not None:
            self._snap = snapshot(state, now=time.time())
            self._at = time.time()
            if self.live.is_started:
                self.live.refresh()

    def close(self) -> None:
        if self.state is not None and self.state.started is not None:
            self._snap = snapshot(self.state)
        self.live.stop()


def _advance_wall(s: Snapshot, dt: float) -> Snapshot:
    budgets = [
        b.model_copy(update={"used": b.used + dt, "left": None if b.left is None else max(0.0, b.left - dt)})
        if b.name == "wall"
        else b
        for b in s.budgets
    ]
    return s.model_copy(update={"budgets": budgets})


def is_terminal() -> bool:
    """Animate only for a person at a terminal: never in a pipe, a file, CI or TERM=dumb."""
    return sys.stdout.isatty() and os.environ.get("TERM", "") != "dumb" and not os.environ.get("CI")


def make_view(
    reader: Store, run_id: str, *, after: int = 0, as_json: bool = False, quiet: bool = False
) -> View:
    """The view for the CLI's flags: --quiet shows nothing live, --json machine lines, else text."""
    if quiet:
        return View(reader, run_id, after)
    if as_json:
        return JsonView(reader, run_id, after)
    if is_terminal():
        return LiveView(reader, run_id, after)
    return PlainView(reader, run_id, after)
