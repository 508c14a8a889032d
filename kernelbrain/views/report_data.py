"""What `kb report` shows, derived from the log: the folded state with device seconds per measurement,
the subject candidate, its roofline numbers, the funnel through the rungs."""

from __future__ import annotations

import math
import statistics
from collections import Counter

from kernelbrain.core.errors import RunError
from kernelbrain.core.events import BudgetCharged, ProfileCaptured, RungBenchmarked
from kernelbrain.core.state import Candidate, RunState
from kernelbrain.runtime.runner import require_run
from kernelbrain.store import Store, StoredEvent
from kernelbrain.views.describe import status_dict

ROOFLINE_KEYS = ("time_s", "bytes", "flops", "bandwidth_Bps", "matmul_flops")


class ReportState(RunState):
    """RunState plus the device seconds charged when each measurement was recorded."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.measured: list[tuple[float, RungBenchmarked]] = []
        self.gpu_by_role: Counter[str] = Counter()
        self._unpaid: list[RungBenchmarked] = []

    def _apply_RungBenchmarked(self, e: RungBenchmarked, raw: StoredEvent) -> None:
        super()._apply_RungBenchmarked(e, raw)
        self._unpaid.append(e)

    def _apply_BudgetCharged(self, e: BudgetCharged, raw: StoredEvent) -> None:
        # a worker appends a result and the charge that paid for it together: the result is placed
        # after its own cost
        super()._apply_BudgetCharged(e, raw)
        self.gpu_by_role[e.role] += e.gpu_s
        self.measured += [(self.gpu_s, r) for r in self._unpaid]
        self._unpaid.clear()

    def timeline(self) -> list[tuple[float, RungBenchmarked]]:
        return self.measured + [(self.gpu_s, r) for r in self._unpaid]


def load_report_state(store: Store, run_id: str) -> ReportState:
    require_run(store, run_id)
    state = store.fold(ReportState(run_id), run_id=run_id)
    if state.started is None:
        raise RunError(f"run {run_id} has no RunStarted event")
    return state


def geo_speedup(r: RungBenchmarked) -> float:
    """Geometric mean of the per-shape speedups (the score without its spread discount)."""
    if not r.shapes:
        return 0.0
    return math.exp(statistics.fmean(math.log(max(s.speedup, 1e-12)) for s in r.shapes))


def subject(state: RunState) -> tuple[Candidate | None, str]:
    """The candidate the report is about: the recorded winner, or the leader of a run still going."""
    if state.finished is not None:
        if state.finished.winner:
            return state.candidates[state.finished.winner], "winner"
        return None, "no winner"
    leader = state.leader()
    return (leader, "leader (run not finished)") if leader else (None, "no candidate measured yet")


def roofline_metrics(profile: ProfileCaptured | None) -> dict[str, float] | None:
    """The analytical roofline's numbers; an ncu profile carries them with a `roofline_` prefix."""
    if profile is None:
        return None
    m = profile.metrics
    if profile.source == "ncu":
        m = {k.removeprefix("roofline_"): v for k, v in m.items() if k.startswith("roofline_")}
    if not all(k in m for k in ROOFLINE_KEYS) or m["time_s"] <= 0 or m["bytes"] <= 0:
        return None
    return m


def funnel(state: RunState) -> list[dict[str, int | str]]:
    """Per stage: how many candidates reached it, were measured there, failed, were promoted or pruned."""
    d = status_dict(state)
    rows: list[dict[str, int | str]] = [
        {"stage": "proposed", "reached": d["candidates"]["proposed"]},
        {
            "stage": "gated",
            "reached": d["candidates"]["gate_passed"] + d["candidates"]["gate_failed"],
            "passed": d["candidates"]["gate_passed"],
            "failed": d["candidates"]["gate_failed"],
        },
    ]
    cs = list(state.candidates.values())
    for rung, measured in enumerate(d["measured_at_rung"]):
        rows.append(
            {
                "stage": f"rung {rung}",
                "reached": sum(rung in c.admitted for c in cs),
                "measured": measured,
                "failed": sum(c.bench_failed is not None and c.bench_failed.rung == rung for c in cs),
                "promoted": sum(rung in c.promotions for c in cs),
                "pruned": sum(c.pruned is not None and c.pruned.rung == rung for c in cs),
            }
        )
    rows.append({"stage": "profiled", "reached": d["candidates"]["finalists"]})
    return rows
