"""The report's plots: matplotlib figures rendered to inline SVG whose text stays searchable."""

from __future__ import annotations

import html
import io
from collections import Counter
from typing import TYPE_CHECKING

from kernelbrain.core.state import Candidate, RunState
from kernelbrain.views.report_data import ReportState, geo_speedup, roofline_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def new_figure(width: float, height: float) -> Figure:
    # imported when a plot is drawn: a bad run id or output path is reported without loading matplotlib
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def svg(fig: Figure, name: str) -> str:
    import matplotlib

    buf = io.StringIO()
    # a salt per plot keeps the ids of markers and clip paths distinct between the inlined SVGs
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        fig.savefig(
            buf,
            format="svg",
            bbox_inches="tight",
            metadata={"Date": None, "Creator": None, "Format": None, "Type": None},
        )
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE: this SVG lives inside HTML


def figure(name: str, fig: Figure, caption: str) -> str:
    return (
        f'<figure class="plot" data-plot="{name}">{svg(fig, name)}'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def speedup_plot(state: ReportState) -> str:
    fig = new_figure(8, 3.8)
    ax = fig.add_subplot()
    points = state.timeline()
    values = [geo_speedup(r) for _, r in points]
    for rung in sorted({r.rung for _, r in points}):
        xs = [x for x, r in points if r.rung == rung]
        ys = [geo_speedup(r) for _, r in points if r.rung == rung]
        best = [max(ys[: i + 1]) for i in range(len(ys))]
        color = f"C{rung % 10}"
        ax.step(
            [*xs, state.gpu_s], [*best, best[-1]], where="post", color=color, label=f"best at rung {rung}"
        )
        ax.scatter(xs, ys, color=color, s=18, alpha=0.6)
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1, label="reference (1x)")
    if max(values) / max(min(values), 1e-12) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("device seconds charged (cumulative)")
    ax.set_ylabel("speedup vs reference (geomean over shapes)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return figure(
        "speedup",
        fig,
        "Each dot is one candidate measured at one rung, placed at the device time spent when its "
        "result was recorded; the lines are the best so far at each rung.",
    )


def funnel_plot(stages: list[tuple[str, int]]) -> str:
    fig = new_figure(8, 0.45 * len(stages) + 0.8)
    ax = fig.add_subplot()
    labels = [s for s, _ in stages][::-1]
    counts = [n for _, n in stages][::-1]
    bars = ax.barh(labels, counts, color="C0")
    ax.bar_label(bars, padding=3)
    ax.set_xlabel("candidates")
    ax.set_xlim(0, max(max(counts), 1) * 1.12)
    return figure("funnel", fig, "How many candidates reached each stage of the ladder.")


def failure_plot(gate: Counter[str], ladder: Counter[str]) -> str:
    cats = sorted(set(gate) | set(ladder), key=lambda c: (-(gate[c] + ladder[c]), c))[::-1]
    fig = new_figure(8, 0.45 * len(cats) + 1.0)
    ax = fig.add_subplot()
    g = ax.barh(cats, [gate[c] for c in cats], color="C3", label="at the gate")
    ax.bar_label(g, label_type="center", labels=[str(gate[c]) if gate[c] else "" for c in cats])
    b = ax.barh(
        cats, [ladder[c] for c in cats], left=[gate[c] for c in cats], color="C1", label="on the ladder"
    )
    ax.bar_label(b, label_type="center", labels=[str(ladder[c]) if ladder[c] else "" for c in cats])
    ax.set_xlabel("candidates")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
    return figure("failures", fig, "Failures per category: gate rejections and faults on the ladder.")


def roofline_plot(state: RunState, winner: Candidate, m: dict[str, float]) -> str:
    bw, peak = m["bandwidth_Bps"], m["matmul_flops"]
    ridge = peak / bw
    points = [(winner, m)]
    points += [
        (c, rm)
        for cid in state.profiled
        if cid != winner.id and (rm := roofline_metrics((c := state.candidates[cid]).profile))
    ]
    intensities = [p["flops"] / p["bytes"] for _, p in points] + [ridge]
    lo, hi = min(intensities) / 30, max(intensities) * 30
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig = new_figure(8, 4.2)
    ax = fig.add_subplot()
    ax.plot(xs, [min(bw * x, peak) for x in xs], color="0.2", label="measured ceilings")
    ax.axvline(ridge, color="0.6", linestyle=":", linewidth=1)
    for c, p in points[::-1]:
        ai, achieved = p["flops"] / p["bytes"], p["flops"] / p["time_s"]
        mine = c is winner
        ax.scatter(
            [ai],
            [achieved],
            s=70 if mine else 30,
            color="C3" if mine else "0.55",
            zorder=3,
            label=f"winner {c.id}" if mine else None,
        )
        ax.annotate(c.id[:8], (ai, achieved), textcoords="offset points", xytext=(6, 4), fontsize=7)
    if len(points) > 1:
        ax.scatter([], [], color="0.55", s=30, label="other finalists")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="lower right")
    return figure(
        "roofline",
        fig,
        "Achieved rate at the primary shape against the device's measured copy bandwidth and matmul "
        "rate (the analytical roofline of the profiler).",
    )
