"""`kb report`: one self-contained HTML page on a run, from its log alone.

The page holds the best speedup found against the device seconds charged, the candidates' lineage with
their promotions and prunes, the funnel through the rungs, the failures per category, the winner's
profile against the roofline, and the winner's source with its diff against its parent. The log is
folded through `RunState`, the same way every worker folds it. `ReportState` adds only what the
projection drops: when each measurement arrived in device seconds.

The plots use matplotlib. It is well kept, it needs no browser or JavaScript to draw, and its SVG
output inlines into the page. The page then works offline and stays crisp at any zoom, and its text
stays text (`svg.fonttype: none`) so a reader can search it. A JavaScript plotting library would have
meant inlining hundreds of kilobytes of script for four static charts.
"""

from __future__ import annotations

import difflib
import html
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbrain.core.errors import RunError
from kernelbrain.core.events import GateFailed, GatePassed
from kernelbrain.core.state import Candidate, RunState
from kernelbrain.store import Store
from kernelbrain.views.audit import audit
from kernelbrain.views.describe import fmt_s, knobs_text, status_dict
from kernelbrain.views.report_data import (
    ReportState,
    funnel,
    geo_speedup,
    load_report_state,
    roofline_metrics,
    subject,
)
from kernelbrain.views.report_plots import failure_plot, funnel_plot, roofline_plot, speedup_plot

if TYPE_CHECKING:
    pass

NCU_HEADLINES = {  # Nsight Compute's own percentages of peak, shown beside the roofline's
    "dram_throughput_pct": "ncu DRAM throughput",
    "compute_throughput_pct": "ncu compute throughput",
    "achieved_occupancy_pct": "ncu achieved occupancy",
}


# --- sections ------------------------------------------------------------------------------------


def _esc(x: object) -> str:
    return html.escape(str(x))


def _table(head: Iterable[str], rows: Iterable[Iterable[object]], cls: str = "") -> str:
    th = "".join(f"<th>{_esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_esc(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{_esc(title)}</h2>{body}</section>'


def _summary(state: ReportState, winner: Candidate | None, role: str) -> str:
    d = status_dict(state)
    cfg = state.config
    assert state.started is not None
    ladder = "; ".join(f"{i}: {r.shapes} x{r.repeats}" for i, r in enumerate(cfg.rungs))
    by_role = ", ".join(f"{k} {v:.3g}" for k, v in sorted(state.gpu_by_role.items()) if v)
    rows: list[tuple[str, object]] = [
        ("problem", f"{state.started.problem_name} ({state.started.problem_path})"),
        ("device, generator, seed, eta", f"{cfg.device}, {cfg.generator}, {cfg.seed}, {cfg.eta}"),
        ("ladder (shapes x repeats)", ladder),
        ("state", d["state"] + (f": {d['finish_reason']}" if d["finish_reason"] else "")),
        (role, f"{winner.id} ({winner.proposal.family}/{winner.proposal.strategy})" if winner else "-"),
        ("device seconds charged", f"{state.gpu_s:.4g} s" + (f" ({by_role})" if by_role else "")),
        ("LLM tokens, wall time", f"{state.tokens}, {state.wall_s:.4g} s"),
        ("events, resumes", f"{d['events']}, {d['resumes']}"),
    ]
    if state.finished and state.finished.note:
        rows.append(("winner vs runner-up", state.finished.note))
    return _table(["", ""], rows, "kv")


def _speedup_section(state: ReportState, winner: Candidate | None) -> str:
    points = state.timeline()
    if not points:
        return "<p>No candidate has been measured yet.</p>"
    parts = []
    if winner and winner.top_result:
        top = winner.top_result
        when = next(x for x, r in points if r is top)
        parts.append(
            f'<p class="headline">Best: <b class="best-speedup">{geo_speedup(top):.4g}x</b> (geomean over '
            f"{len(top.shapes)} shape(s), score {top.score:.4g}) by <code>{_esc(winner.id)}</code> at rung "
            f"{top.rung}, measured after {when:.4g} of {state.gpu_s:.4g} device seconds [{_esc(top.timer)}]."
            "</p>"
        )
        parts.append(
            _table(
                ["shape", "candidate median", "IQR", "reference median", "repeats", "speedup"],
                (
                    (
                        s.shape,
                        fmt_s(s.cand_median_s),
                        fmt_s(s.cand_iqr_s),
                        fmt_s(s.ref_median_s),
                        s.repeats,
                        f"{s.speedup:.4g}x",
                    )
                    for s in top.shapes
                ),
                "shapes",
            )
        )
    parts.append(speedup_plot(state))
    return "".join(parts)


def _status(state: RunState, c: Candidate, winner: Candidate | None) -> tuple[str, str]:
    """(css class, short text) of where a candidate ended."""
    if winner is not None and c.id == winner.id:
        return "winner", "winner"
    if c.late:
        return "late", "proposed after the run finished"
    if isinstance(c.gate, GateFailed):
        return "failed", f"gate failed: {c.gate.category}"
    if c.bench_failed is not None:
        return "failed", f"failed at rung {c.bench_failed.rung}: {c.bench_failed.category}"
    if c.pruned is not None:
        where = f"at rung {c.pruned.rung}" if c.pruned.rung >= 0 else "before measurement"
        return "pruned", f"pruned {where}"
    if c.profile is not None:
        return "finalist", "finalist"
    return "live", "in progress" if state.finished is None else "unresolved"


def _node(state: RunState, c: Candidate, kids: dict[str | None, list[Candidate]], ctx: dict) -> str:
    cls, status = _status(state, c, ctx["winner"])
    path_cls = " on-path" if c.id in ctx["path"] else ""
    steps = []
    for rung in sorted(c.results):
        step = f"r{rung} {c.results[rung].score:.3g}"
        if rung in c.promotions:
            p = c.promotions[rung]
            step += f" &#8593;{p.rank}/{p.n_peers}"
        steps.append(step)
    detail = []
    if c.pruned is not None:
        detail.append(c.pruned.reason)
    if isinstance(c.gate, GateFailed):
        detail.append(c.gate.detail)
    if c.bench_failed is not None and c.pruned is None:  # the prune's reason quotes the fault
        detail.append(c.bench_failed.detail)
    if c.profile is not None:
        detail.append("profile: " + ", ".join(c.profile.labels))
    origin = (
        f" (parent {c.proposal.parent} is not in this run)"
        if c.proposal.parent and c.proposal.parent not in state.candidates
        else ""
    )
    title = f"round {c.proposal.round} by {c.proposal.generator}: {c.proposal.hint}{origin}"
    children = "".join(_node(state, k, kids, ctx) for k in kids.get(c.id, []))
    return (
        f'<li class="node {cls}{path_cls}" data-candidate="{_esc(c.id)}" data-status="{cls}">'
        f'<div class="row" title="{_esc(title)}"><code class="cid">{_esc(c.id)}</code> '
        f'<span class="what">{_esc(c.proposal.family)}: {_esc(knobs_text(c))}</span> '
        f'<span class="badge {cls}">{_esc(status)}</span> '
        f'<span class="ladder">{" &#183; ".join(steps)}</span>'
        f'<div class="why">round {c.proposal.round}, {_esc(c.proposal.hint)}{_esc(origin)}'
        + (f"<br>{_esc('; '.join(detail))}" if detail else "")
        + "</div></div>"
        + (f"<ul>{children}</ul>" if children else "")
        + "</li>"
    )


def _lineage_section(state: RunState, winner: Candidate | None) -> str:
    if not state.candidates:
        return "<p>No candidate has been proposed yet.</p>"
    kids: dict[str | None, list[Candidate]] = {}
    for c in sorted(state.candidates.values(), key=lambda c: c.ordinal):
        parent = c.proposal.parent if c.proposal.parent in state.candidates else None
        kids.setdefault(parent, []).append(c)
    path: set[str] = set()
    walk = winner
    while walk is not None:
        path.add(walk.id)
        walk = state.candidates.get(walk.proposal.parent) if walk.proposal.parent else None
    n_prom = sum(len(c.promotions) for c in state.candidates.values())
    n_pruned = sum(c.pruned is not None for c in state.candidates.values())
    roots = "".join(_node(state, c, kids, {"winner": winner, "path": path}) for c in kids.get(None, []))
    legend = (
        '<p class="legend"><span class="badge winner">winner</span> <span class="badge finalist">'
        'finalist</span> <span class="badge pruned">pruned</span> <span class="badge failed">failed</span>'
        f" &#8212; {len(state.candidates)} candidates, {n_prom} promotions, {n_pruned} prunes. Each row: "
        "id, family and knobs, outcome, then score per rung (r<i>n</i>) with &#8593;rank/peers where it "
        "was promoted. The winner's ancestry is outlined.</p>"
    )
    return legend + f'<ul class="tree">{roots}</ul>'


def _funnel_section(state: RunState) -> str:
    rows = funnel(state)
    cols = ["reached", "measured", "passed", "failed", "promoted", "pruned"]
    table = _table(["stage", *cols], ([r["stage"], *(r.get(k, "") for k in cols)] for r in rows), "funnel")
    stages = [("proposed", rows[0]["reached"]), ("passed the gate", rows[1]["passed"])]
    stages += [(f"measured at {r['stage']}", r["measured"]) for r in rows[2:-1]]
    stages.append(("profiled", rows[-1]["reached"]))
    return table + funnel_plot([(s, int(n)) for s, n in stages])


def _failures_section(state: RunState) -> str:
    gate: Counter[str] = Counter()
    ladder: Counter[str] = Counter()
    example: dict[str, str] = {}
    for c in sorted(state.candidates.values(), key=lambda c: c.ordinal):
        if isinstance(c.gate, GateFailed):
            gate[c.gate.category] += 1
            example.setdefault(c.gate.category, f"{c.id}: {c.gate.detail}")
        if c.bench_failed is not None:
            ladder[c.bench_failed.category] += 1
            example.setdefault(c.bench_failed.category, f"{c.id}: {c.bench_failed.detail}")
    passed = sum(isinstance(c.gate, GatePassed) for c in state.candidates.values())
    head = (
        f"<p>{sum(gate.values())} candidate(s) failed the gate and {passed} passed it; "
        f"{sum(ladder.values())} faulted on the ladder.</p>"
    )
    if not gate and not ladder:
        return head
    cats = sorted(set(gate) | set(ladder), key=lambda c: (-(gate[c] + ladder[c]), c))
    rows = ((c, gate[c], ladder[c], _clip(example[c], 200)) for c in cats)
    return (
        head
        + _table(["category", "at the gate", "on the ladder", "first example"], rows, "failures")
        + failure_plot(gate, ladder)
    )


def _pct(x: float) -> str:
    return f"{x * 100:.3g}%"


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _profile_section(state: RunState, winner: Candidate | None) -> str:
    if winner is None:
        return "<p>No winner to profile.</p>"
    p = winner.profile
    if p is None:
        return f"<p><code>{_esc(winner.id)}</code> was not profiled (it did not finish the top rung).</p>"
    parts = [f'<p>Profiled by {_esc(p.source)}: <span class="labels">{_esc(", ".join(p.labels))}</span></p>']
    if p.note:
        parts.append(f"<p>{_esc(p.note)}</p>")
    m = roofline_metrics(p)
    if m is not None:
        bw, peak = m["bandwidth_Bps"], m["matmul_flops"]
        bw_got, fl_got = m["bytes"] / m["time_s"], m["flops"] / m["time_s"]
        floor_s = max(m["bytes"] / bw, m["flops"] / peak)
        rows = [
            ("time at the primary shape", fmt_s(m["time_s"])),
            ("bytes moved, FLOPs", f"{m['bytes']:.4g} B, {m['flops']:.4g} FLOP"),
            ("arithmetic intensity", f"{m['flops'] / m['bytes']:.4g} FLOP/B (ridge {peak / bw:.4g} FLOP/B)"),
            ("achieved bandwidth", f"{bw_got / 1e9:.4g} GB/s, {_pct(bw_got / bw)} of {bw / 1e9:.4g} GB/s"),
            (
                "achieved compute",
                f"{fl_got / 1e9:.4g} GFLOP/s, {_pct(fl_got / peak)} of {peak / 1e9:.4g} GFLOP/s",
            ),
            ("roofline floor / time", _pct(floor_s / m["time_s"])),
        ]
        rows += [(NCU_HEADLINES[k], f"{p.metrics[k]:.3g}%") for k in NCU_HEADLINES if k in p.metrics]
        parts.append(_table(["roofline", ""], rows, "kv roofline"))
        parts.append(roofline_plot(state, winner, m))
    if p.source == "ncu":
        ncu = sorted((k, v) for k, v in p.metrics.items() if not k.startswith("roofline_"))
        parts.append(
            "<details><summary>Nsight Compute metrics</summary>"
            + _table(["metric", "value"], ((k, f"{v:.4g}") for k, v in ncu), "kv")
            + "</details>"
        )
    return "".join(parts)


def _diff_html(old: str, new: str, old_name: str, new_name: str) -> tuple[str, int, int]:
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), fromfile=old_name, tofile=new_name, lineterm=""
        )
    )
    out, added, removed = [], 0, 0
    for line in lines:
        if line.startswith(("+++", "---")):
            cls = "meta"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls, added = "add", added + 1
        elif line.startswith("-"):
            cls, removed = "del", removed + 1
        else:
            cls = "ctx"
        out.append(f'<span class="{cls}">{_esc(line)}</span>')
    return "".join(out), added, removed  # each line is a block: no newlines between them


def _source_section(store: Store, state: RunState, winner: Candidate | None) -> str:
    if winner is None:
        return "<p>No winner yet.</p>"
    source = store.get_blob(winner.proposal.source).decode()
    parts = []
    parent_id = winner.proposal.parent
    if parent_id and parent_id in state.candidates:
        parent_src = store.get_blob(state.candidates[parent_id].proposal.source).decode()
        diff, added, removed = _diff_html(
            parent_src, source, f"{parent_id} (parent)", f"{winner.id} (winner)"
        )
        parts.append(
            f'<h3>Diff against its parent <code>{_esc(parent_id)}</code></h3><p class="diffstat">'
            f"{added} line(s) added, {removed} removed; the mutation answered: "
            f"{_esc(winner.proposal.hint)}</p>"
            + (f'<pre class="diff">{diff}</pre>' if diff else "<p>The sources are identical.</p>")
        )
    elif parent_id:
        parts.append(f"<p>Its parent <code>{_esc(parent_id)}</code> is not in this run: no diff.</p>")
    else:
        parts.append(
            f"<p>A root candidate (no parent: proposed by {_esc(winner.proposal.generator)} for "
            f"{_esc(winner.proposal.hint)}), so there is no diff.</p>"
        )
    parts.append(f'<h3>Source of <code>{_esc(winner.id)}</code></h3><pre class="source">{_esc(source)}</pre>')
    return "".join(parts)


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; }
body { margin: 0 auto; max-width: 1100px; padding: 1em 2em; }
h1 { font-size: 1.5em; }
h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
h3 { font-size: 1.05em; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: .6em 0; }
td, th { padding: 2px 10px; border-bottom: 1px solid #eee; text-align: left; }
table.kv td:first-child { color: #555; white-space: nowrap; }
figure.plot { margin: 1em 0; }
figure.plot svg { width: 100%; max-width: 900px; height: auto; display: block; }
figcaption { color: #555; font-size: .9em; }
code, pre { font: 12px/1.4 ui-monospace, monospace; }
pre { background: #f7f7f7; padding: .8em; overflow-x: auto; border: 1px solid #e3e3e3; }
pre.diff span { display: block; white-space: pre; min-height: 1.4em; }
.add { background: #e6ffec; }
.del { background: #ffebe9; }
.hunk { color: #0550ae; background: #f0f6ff; }
.meta { color: #666; font-weight: bold; }
ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 1.4em; }
ul.tree { padding-left: 0; }
ul.tree ul { border-left: 1px dotted #aaa; }
li.node > .row { padding: 2px 6px; margin: 2px 0; border-radius: 4px; }
li.node.on-path > .row { outline: 2px solid #c62828; }
.row .what { color: #444; }
.row .ladder { color: #555; font-size: .9em; margin-left: .5em; }
.row .why { color: #777; font-size: .85em; margin-left: 1.2em; }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: .8em; background: #eee; }
.badge.winner { background: #c62828; color: #fff; }
.badge.finalist { background: #2e7d32; color: #fff; }
.badge.pruned { background: #9e9e9e; color: #fff; }
.badge.failed { background: #ef6c00; color: #fff; }
.headline { font-size: 1.1em; }
"""

SECTIONS = (
    ("speedup", "Best speedup over device time"),
    ("lineage", "Candidate lineage"),
    ("funnel", "Funnel per rung"),
    ("failures", "Failures by category"),
    ("profile", "Winner's profile against the roofline"),
    ("source", "Winner's source"),
    ("audit", "Audit"),
)


def render(store: Store, state: ReportState) -> str:
    winner, role = subject(state)
    assert state.started is not None
    audit_text = audit(state, winner.id) if winner else "no measured candidate to audit"
    bodies = {
        "speedup": _speedup_section(state, winner),
        "lineage": _lineage_section(state, winner),
        "funnel": _funnel_section(state),
        "failures": _failures_section(state),
        "profile": _profile_section(state, winner),
        "source": _source_section(store, state, winner),
        "audit": (
            f"<details><summary>kb audit {_esc(state.run_id)}</summary>"
            f"<pre>{_esc(audit_text)}</pre></details>"
        ),
    }
    nav = "".join(f'<a href="#{a}">{_esc(t)}</a>' for a, t in SECTIONS)
    title = f"kb report: run {state.run_id} ({state.started.problem_name})"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{_esc(title)}</h1>{_summary(state, winner, role)}<nav>{nav}</nav>"
        + "".join(_section(a, t, bodies[a]) for a, t in SECTIONS)
        + "</body></html>\n"
    )


def write_report(store: Store, run_id: str, out: str | Path) -> Path:
    state = load_report_state(store, run_id)
    path = Path(out)
    try:
        f = path.open("w", encoding="utf-8")  # before drawing: a bad path fails at once
    except OSError as e:
        raise RunError(
            f"cannot write {path}: {e.strerror}; pass -o a path in an existing, writable folder"
        ) from e
    try:
        with f:
            f.write(render(store, state))
    except BaseException:
        path.unlink(missing_ok=True)  # no half-written page left behind
        raise
    return path
