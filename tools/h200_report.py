"""The report phase of issue 5's measurement (tools/h200_measure.py report): h200.json and RESULTS.md
from the searches' databases and the compare files: speedups, targets met or missed (by how much), the
ablation, the GPU's busy fraction, the winner's profile."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from tools.h200_records import LADDERS, dump, load, run_of

# issue 5, section 2: large shapes (the problem's primary shape), speedup over eager / torch.compile
TARGETS: dict[str, dict[str, float]] = {
    "group_conv": {"eager": 10.0},
    "rmsnorm": {"eager": 3.0, "compile": 1.05},
    "softmax": {"eager": 1.9, "compile": 1.4},
    "matvec": {"eager": 1.15},
    "linear_relu_div": {"eager": 1.1},
    "sdp_attn": {"eager_every_shape": 1.0},
}
GEOMEAN_TARGET = 2.3
ABLATION_TARGET = 0.5  # the ladder's GPU seconds over flat's, for a winner equal within noise
BUSY_TARGET = 0.8
GPU_ROLES = {"gatekeeper", "benchmarker", "profiler"}


def _busy(store, state) -> dict:
    """Fraction of the run's wall time with a GPU task in flight: the union of the GPU roles'
    charged intervals [recorded - wall_s, recorded] over the run's first to last event."""
    events = list(store.iter_events(run_id=state.run_id))
    t0, t1 = events[0].ts, events[-1].ts
    spans, by_role = [], {}
    for e in events:
        if e.type != "BudgetCharged":
            continue
        p = e.payload
        by_role[p["role"]] = by_role.get(p["role"], 0.0) + p["wall_s"]
        if p["role"] in GPU_ROLES:
            spans.append((e.ts - p["wall_s"], e.ts))
    busy, end = 0.0, -math.inf
    for a, b in sorted(spans):
        a = max(a, end)
        if b > a:
            busy += b - a
        end = max(end, b)
    wall = max(t1 - t0, 1e-9)
    # where the idle time went: before the first GPU task (workers start, the analysis, round 0's
    # proposals), between tasks, and after the last one
    start = min((a for a, _ in spans), default=t1) - t0
    after = max(t1 - end, 0.0) if spans else 0.0
    return {
        "wall_s": wall,
        "gpu_busy_s": busy,
        "busy_fraction": busy / wall,
        "idle_s": {"start": start, "between": max(wall - busy - start - after, 0.0), "end": after},
        "task_wall_s_by_role": by_role,
        "gpu_s_charged": state.gpu_s,
    }


def _ablation_arm(store, state) -> dict:
    """GPU seconds charged until the winner was first measured (any rung) and until its highest
    rung's measurement was recorded."""
    win = state.finished.winner if state.finished else None
    charged, first_any, first_top = 0.0, None, None
    top = max(state.candidates[win].results) if win and state.candidates[win].results else None
    # what the GPU seconds to the winner's first measurement paid for, by task kind (gen, gate, bench,
    # profile): the arms differ only in bench, so the rest bounds what the ladder can save
    by_task: dict[str, float] = {}
    # a measurement's own charge is recorded just after it: it is counted in
    pending_any = pending_top = False
    for e in store.iter_events(run_id=state.run_id):
        p = e.payload
        if e.type == "RungBenchmarked" and p["candidate"] == win:
            pending_any = pending_any or first_any is None
            pending_top = pending_top or (p["rung"] == top and first_top is None)
        elif e.type == "BudgetCharged":
            charged += p["gpu_s"]
            if first_any is None:
                kind = p["action"].split("/")[1] if p["action"].count("/") else p["action"]
                by_task[kind] = by_task.get(kind, 0.0) + p["gpu_s"]
            if pending_any:
                first_any, pending_any = charged, False
            if pending_top:
                first_top, pending_top = charged, False
    res = state.candidates[win].results[top] if win else None
    return {
        "run_id": state.run_id,
        "winner": win,
        "winner_rung": top,
        "candidates": len(state.candidates),
        "gpu_s_to_winner_first_measured": first_any,
        "gpu_s_to_winner_first_by_task": by_task,
        "gpu_s_to_winner_top_measured": first_top,
        "gpu_s_total": state.gpu_s,
        "winner_score": res.score if res else None,
        "finish_reason": state.finished.reason if state.finished else None,
    }


def _winner_profile(store, state) -> dict | None:
    win = state.finished.winner if state.finished else None
    for e in store.iter_events(run_id=state.run_id):
        if e.type == "ProfileCaptured":
            p = e.payload
            if p.get("candidate") == win:
                return {k: p.get(k) for k in ("source", "labels", "metrics", "note") if k in p}
    return None


def _idle(busy: dict) -> str:
    idle = busy.get("idle_s")  # absent from reports made before it was recorded
    return f" ({idle['start']:.1f} / {idle['between']:.1f} / {idle['end']:.1f})" if idle else ""


def ablation_verdict(entry: dict) -> dict | None:
    """Issue 5, section 3: the ladder's GPU seconds to its winner's first measurement over flat's, and
    whether the two winners are equal within noise at the large shape (their medians' IQR bands, from
    the compare, overlap)."""
    if "ladder" not in entry or "flat" not in entry:
        return None
    first = {arm: entry[arm]["ablation"]["gpu_s_to_winner_first_measured"] for arm in ("ladder", "flat")}
    times = entry.get("compare", {}).get("shapes", [{}])[0].get("times", {})
    lad, flat = times.get("kb_ladder"), times.get("kb_flat")
    if None in first.values() or not lad or not flat:
        return None
    lo, hi = sorted((lad, flat), key=lambda t: t["median_s"])
    equal = lo["median_s"] + lo["iqr_s"] / 2 >= hi["median_s"] - hi["iqr_s"] / 2
    ratio = first["ladder"] / first["flat"]
    same = entry["ladder"]["ablation"]["winner"] == entry["flat"]["ablation"]["winner"]
    return {
        "ratio": ratio,
        "same_winner": same,
        "equal_within_noise": same or equal,
        "met": ratio <= 0.5 and (same or equal),
    }


def _ablation_verdicts(doc: dict) -> list[str]:
    out = [
        "",
        "Target (issue 5, section 3): the ladder's GPU s to its winner's first measurement <= 50% of flat's, "
        "for a winner equal within noise: the same candidate, or two whose bands median +/- IQR/2 at the "
        "large shape overlap.",
        "",
        "| problem | ladder / flat GPU s to the winner | winners | met |",
        "| --- | --- | --- | --- |",
    ]
    for name, e in doc["problems"].items():
        v = e.get("ablation_verdict")
        if v:
            winners = (
                "same" if v["same_winner"] else "equal within noise" if v["equal_within_noise"] else "differ"
            )
            out.append(f"| {name} | {v['ratio'] * 100:.0f}% | {winners} | {'yes' if v['met'] else 'NO'} |")
    return out


def report(problems: list[str], outdir: Path, ceil_path: Path, results: Path, command: str) -> None:
    ceil = load(ceil_path)
    doc: dict[str, Any] = {"command": command, "ceilings": ceil, "problems": {}, "targets": TARGETS}
    primaries: list[float] = []
    for name in problems:
        entry: dict[str, Any] = {}
        cmp_path = outdir / "compare" / f"{name}.json"
        if cmp_path.exists():
            entry["compare"] = load(cmp_path)
        for arm in LADDERS:
            db = outdir / arm / f"{name}.db"
            if not db.exists():
                continue
            store, state = run_of(db)
            with store:
                entry[arm] = {
                    "ablation": _ablation_arm(store, state),
                    "busy": _busy(store, state),
                    "winner_profile": _winner_profile(store, state),
                }
        # targets at the primary shape
        verdicts = []
        shapes = entry.get("compare", {}).get("shapes", [])
        for s in shapes:
            t = s["times"]
            if "kb_ladder" not in t or "median_s" not in t["kb_ladder"]:
                continue
            kb = t["kb_ladder"]["median_s"]
            compiled = [t[k]["median_s"] for k in t if k.startswith("compile_") and "median_s" in t[k]]
            s["kb_vs_eager"] = t["eager"]["median_s"] / kb
            s["kb_vs_best_compile"] = min(compiled) / kb if compiled else None
            default = t.get("compile_default", {}).get("median_s")
            s["kb_vs_compile_default"] = default / kb if default else None
            if s["primary"]:
                primaries.append(s["kb_vs_eager"])
                for what, need in TARGETS.get(name, {}).items():
                    if what == "eager_every_shape":
                        continue
                    # the compile target names torch.compile (default); the stricter reading,
                    # against the faster of both compile modes, is reported beside it
                    rows = (
                        [("eager", s["kb_vs_eager"])]
                        if what == "eager"
                        else [
                            ("torch.compile (default)", s["kb_vs_compile_default"]),
                            ("best compile mode (stricter, not the issue's)", s["kb_vs_best_compile"]),
                        ]
                    )
                    for label, got in rows:
                        verdicts.append(
                            {
                                "target": f">= {need}x {label} ({s['shape']})",
                                "got": got,
                                "met": got is not None and got >= need,
                            }
                        )
            if "eager_every_shape" in TARGETS.get(name, {}):
                need = TARGETS[name]["eager_every_shape"]
                verdicts.append(
                    {
                        "target": f">= {need}x eager ({s['shape']})",
                        "got": s["kb_vs_eager"],
                        "met": s["kb_vs_eager"] >= need,
                    }
                )
            if s["primary"]:
                verdicts.append(
                    {
                        "target": f"not slower than eager ({s['shape']})",
                        "got": s["kb_vs_eager"],
                        "met": s["kb_vs_eager"] >= 1.0,
                    }
                )
        entry["verdicts"] = verdicts
        entry["ablation_verdict"] = ablation_verdict(entry)
        doc["problems"][name] = entry
    geo = math.exp(statistics.fmean(math.log(x) for x in primaries)) if primaries else None
    doc["geomean_vs_eager"] = {
        "value": geo,
        "target": GEOMEAN_TARGET,
        "over": len(primaries),
        "met": geo is not None and geo >= GEOMEAN_TARGET and len(primaries) == 6,
    }
    dump(results / "h200.json", doc)
    (results / "RESULTS.md").write_text(_markdown(doc), encoding="utf-8")
    print((results / "RESULTS.md").read_text())


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3g}"


def _markdown(doc: dict) -> str:
    c = doc["ceilings"]
    out = [
        "# kb on the H200: the six seed problems against eager PyTorch and torch.compile",
        "",
        "Made by (on the device machine, from a clean checkout, `.whl` carried):",
        "",
        f"    {doc['command']}",
        "",
        f"Device: {c['device']}, torch {c['torch']}. Measured ceilings: copy "
        f"{c['copy_bandwidth_Bps'] / 1e12:.2f} TB/s; matmul "
        + ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in c["matmul_flops"].items())
        + f" ({c['note']}).",
        "",
        "Times are medians (ms per call) with the interquartile range, all contenders of a shape timed "
        "interleaved in one process on the same three fresh random input sets, L2 flushed before each "
        "sample. floor: the larger of minimum bytes over copy bandwidth and matmul FLOPs over the "
        "measured matmul rate of the dtype; `of floor` is floor time over kb's time.",
        "",
        "| problem | shape | eager | compile | compile max-autotune | kb (ladder) | kb (flat) | kb vs eager "
        "| kb vs compile | kb vs best compile | of floor |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, e in doc["problems"].items():
        for s in e.get("compare", {}).get("shapes", []):
            t = s["times"]

            def cell(k: str, t: dict = t) -> str:
                if k not in t:
                    return "-"
                if "error" in t[k]:
                    return "failed"
                return f"{_ms(t[k]['median_s'])} ± {_ms(t[k]['iqr_s'])}"

            kbl = t.get("kb_ladder", {})
            out.append(
                f"| {name} | {s['shape']}{' (large)' if s['primary'] else ''} | {cell('eager')} | "
                f"{cell('compile_default')} | {cell('compile_max-autotune-no-cudagraphs')} | "
                f"{cell('kb_ladder')} | {cell('kb_flat')} | "
                f"{s.get('kb_vs_eager', 0):.2f}x | "
                f"{(s.get('kb_vs_compile_default') or 0):.2f}x | "
                f"{(s.get('kb_vs_best_compile') or 0):.2f}x | "
                f"{kbl.get('floor_fraction', 0) * 100:.0f}% |"
            )
    g = doc["geomean_vs_eager"]
    out += [
        "",
        "## Targets (issue 5)",
        "",
        "| problem | target | measured | met |",
        "| --- | --- | --- | --- |",
    ]
    for name, e in doc["problems"].items():
        for v in e["verdicts"]:
            got = "-" if v["got"] is None else f"{v['got']:.2f}x"
            out.append(f"| {name} | {v['target']} | {got} | {'yes' if v['met'] else 'NO'} |")
    out.append(
        f"| all six | geometric mean >= {g['target']}x eager (large shapes) | "
        f"{'-' if g['value'] is None else format(g['value'], '.2f') + 'x'} over {g['over']} | "
        f"{'yes' if g['met'] else 'NO'} |"
    )
    out += [
        "",
        "## Ladder against flat full-fidelity evaluation (same generator, same seed)",
        "",
        "GPU seconds are those charged by the run's BudgetCharged events until the winner's "
        "measurement was recorded.",
        "",
        "| problem | arm | candidates | winner | GPU s to winner (first / top rung) | of the first: by task "
        "| GPU s total | winner at large shape | busy (idle s: start / between / end) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, e in doc["problems"].items():
        for arm in LADDERS:
            if arm not in e:
                continue
            a, b = e[arm]["ablation"], e[arm]["busy"]
            t = e.get("compare", {}).get("shapes", [{}])[0].get("times", {}).get(f"kb_{arm}", {})
            speed = f"{t['speedup_vs_eager']:.2f}x eager" if "speedup_vs_eager" in t else "-"
            f1, f2 = a["gpu_s_to_winner_first_measured"], a["gpu_s_to_winner_top_measured"]
            tasks = a.get("gpu_s_to_winner_first_by_task") or {}
            split = ", ".join(f"{k} {v:.1f}" for k, v in sorted(tasks.items(), key=lambda kv: -kv[1])) or "-"
            out.append(
                f"| {name} | {arm} | {a['candidates']} | {a['winner'] or '-'} | "
                f"{'-' if f1 is None else f'{f1:.1f}'} / {'-' if f2 is None else f'{f2:.1f}'} | {split} | "
                f"{a['gpu_s_total']:.1f} | {speed} | {b['busy_fraction'] * 100:.0f}%{_idle(b)} |"
            )
    out += _ablation_verdicts(doc)
    out += [
        "",
        "## The winners' profiles",
        "",
        "The ladder arm's winner under Nsight Compute at the primary shape: the bottleneck labels kb "
        "derived, then the figures they come from.",
        "",
    ]
    for name, e in doc["problems"].items():
        prof = e.get("ladder", {}).get("winner_profile")
        if prof:
            out.append(
                f"- {name}: {', '.join(prof.get('labels') or []) or 'no label'}"
                + (f" ({prof['note']})" if prof.get("note") else "")
                + _profile_figures(prof.get("metrics") or {})
            )
    return "\n".join(out) + "\n"


def _profile_figures(m: dict) -> str:
    """The ncu figures that decide a label: DRAM and compute throughput, occupancy, registers, and the
    largest warp stall."""
    parts = [
        f"{label} {m[key]:.0f}%"
        for key, label in (
            ("dram_throughput_pct", "DRAM"),
            ("compute_throughput_pct", "compute"),
            ("achieved_occupancy_pct", "occupancy"),
        )
        if m.get(key) is not None
    ]
    if m.get("registers_per_thread") is not None:
        parts.append(f"{m['registers_per_thread']:.0f} registers a thread")
    stalls = {k.removeprefix("stall_"): v for k, v in m.items() if k.startswith("stall_") and v is not None}
    if stalls:
        top = max(stalls, key=lambda k: stalls[k])
        parts.append(f"top stall {top} ({stalls[top]:.2g})")
    return f": {', '.join(parts)}" if parts else ""
