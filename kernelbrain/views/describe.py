"""Plain-text renderings of events and runs for the CLI."""

from __future__ import annotations

import time
from typing import Any

from kernelbrain.core import torch_ops
from kernelbrain.core.errors import UserError
from kernelbrain.core.events import Event, EventError, decode
from kernelbrain.core.state import Candidate, RunState
from kernelbrain.store import Store, StoredEvent

QUIET_TYPES = {"TaskClaimed", "BudgetCharged"}


def knobs_text(c: Candidate) -> str:
    """A candidate's knobs as `name=value, ...`."""
    return ", ".join(f"{k}={v}" for k, v in c.proposal.knobs.items())


def fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def summary(e: Event) -> str:
    """One line saying what an event records."""
    d: Any = e
    match e.TYPE:
        case "RunStarted":
            c = d.config
            allowed = f", torch allowed for {', '.join(c.allow_torch)}" if c.allow_torch else ""
            return (
                f"run started: {d.problem_name} on {c.device}, generator {c.generator}, seed {c.seed}"
                f"{allowed}"
            )
        case "RunResumed":
            return f"run resumed (attempt {d.attempt})"
        case "ProblemAnalysed":
            if d.error:
                return f"problem could not be analysed: {d.error}"
            ops = ", ".join(sorted({o["op"] for o in d.ops}))
            timed = f"; timed at {' | '.join(d.rung_shapes)}" if d.rung_shapes else ""
            timed += "".join(f"; {f['note']}" for f in d.fits if f.get("note"))  # a fit over its budget
            held = f"; accuracy: {d.accuracy.summary()}" if d.accuracy is not None else ""
            return f"problem analysed: ops {ops}; families {', '.join(d.families) or 'none'}{held}{timed}"
        case "CandidateProposed":
            knobs = ", ".join(f"{k}={v}" for k, v in d.knobs.items())
            labelled = f" [{torch_ops.label(d.torch_ops)}]" if d.torch_ops else ""
            return f"proposed {d.candidate} ({d.family}: {knobs}){labelled} round {d.round}: {d.hint}"
        case "GenerationDone":
            note = f"; {d.note}" if d.note else ""
            return f"generation {d.task}: {len(d.proposed)} proposed, {d.duplicates} duplicates{note}"
        case "GatePassed":
            at = f" at {' | '.join(d.shapes)}" if d.shapes else ""
            return f"gate passed {d.candidate}: {d.seeds} seeds{at}, max abs err {d.max_abs_err:.2g}"
        case "GateFailed":
            return f"gate failed {d.candidate} [{d.category}]: {d.detail}"
        case "RungBenchmarked":
            shapes = "; ".join(
                f"{s.shape} {fmt_s(s.cand_median_s)} vs ref {fmt_s(s.ref_median_s)} ({s.speedup:.3g}x)"
                for s in d.shapes
            )
            return f"rung {d.rung} {d.candidate}: score {d.score:.4g}; {shapes}"
        case "BenchmarkFailed":
            return f"rung {d.rung} {d.candidate} failed [{d.category}]: {d.detail}"
        case "ProfileCaptured":
            return f"profiled {d.candidate} ({d.source}): {', '.join(d.labels)}"
        case "Promoted":
            return (
                f"promoted {d.candidate} rung {d.rung_from}->{d.rung_to}: rank {d.rank} of {d.n_peers} "
                f"(keep {d.keep}, threshold {d.threshold:.4g}){'; ' + d.note if d.note else ''}"
            )
        case "Pruned":
            return f"pruned {d.candidate}: {d.reason}"
        case "AdjudicationRequested":
            return (
                f"adjudicate rung {d.rung} ({d.why}): {d.a} {d.a_score:.4g} vs {d.b} {d.b_score:.4g} "
                f"are within their spread ({d.a_spread:.1%}, {d.b_spread:.1%})"
            )
        case "Adjudicated":
            return (
                f"adjudicated rung {d.rung} {d.a} vs {d.b} over {d.pairs} interleaved pairs: time ratio "
                f"{d.ratio_median:.3g} (IQR {d.ratio_q1:.3g}-{d.ratio_q3:.3g}) -> {d.outcome}"
                + (f" ({d.detail})" if d.detail else "")
            )
        case "RunFinished":
            return f"run finished: {d.reason}; winner {d.winner or 'none'}{'; ' + d.note if d.note else ''}"
        case "TaskClaimed":
            return f"{d.worker} claimed {d.task} (token {d.token})"
        case "LeaseExpired":
            return f"lease on {d.task} (token {d.token}, {d.worker}) expired; taken by {d.taken_by}"
        case "TaskFaulted":
            return f"{d.worker} raised on {d.task}: {d.error}"
        case "TaskParked":
            return f"parked {d.task} for this session after {d.faults} faults: {d.error}"
        case "GenerationFailed":
            return f"generation {d.task} failed (resumable): {d.error}"
        case "ProblemFailed":
            return f"the problem's own code failed at the {d.stage}: {d.error}"
        case "RunCopied":
            return f"copied from {d.source}: the {d.events} events before this one, in their order"
        case "BudgetCharged":
            return f"charged {d.action}: {d.gpu_s:.3g} device s, {d.tokens} tokens, {d.wall_s:.3g} wall s"
    return e.TYPE


def event_line(raw: StoredEvent) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(raw.ts))
    return f"#{raw.seq:<6} {stamp} {raw.type:<16} {summary(decode(raw))}"


def status_dict(state: RunState) -> dict:
    cfg = state.config
    counts = {
        "proposed": len(state.candidates),
        "gate_passed": 0,
        "gate_failed": 0,
        "pruned": 0,
        "finalists": 0,
    }
    at_rung = [0] * (state.top_rung + 1)
    for c in state.candidates.values():
        if c.gate is not None:
            counts["gate_passed" if c.gate.TYPE == "GatePassed" else "gate_failed"] += 1
        counts["pruned"] += c.pruned is not None
        counts["finalists"] += c.profile is not None
        for r in c.results:
            at_rung[r] += 1
    leader = state.leader()
    return {
        "run_id": state.run_id,
        "problem": state.started.problem_name if state.started else None,
        "device": cfg.device,
        "generator": cfg.generator,
        "allow_torch": list(cfg.allow_torch),
        "state": "finished" if state.finished else "running or interrupted",
        "finish_reason": state.finished.reason if state.finished else None,
        "winner": state.finished.winner if state.finished else None,
        "leader": leader.id if leader else None,
        "leader_score": leader.top_result.score if leader and leader.top_result else None,
        "leader_speedups": {s.shape: s.speedup for s in leader.top_result.shapes}
        if leader and leader.top_result
        else {},
        "candidates": counts,
        "measured_at_rung": at_rung,
        "budget": {
            "gpu_s": round(state.gpu_s, 3),
            "device_s": round(state.device_s, 3),  # what the GPU budget counts (policy v4: timed spans)
            "budget_gpu_s": cfg.budget_gpu_s,
            "tokens": state.tokens,
            "budget_tokens": cfg.budget_tokens,
            "wall_s": round(state.wall_s, 3),
            "budget_wall_s": cfg.budget_wall_s,
            "max_candidates": cfg.max_candidates,
        },
        "events": state.event_count,
        "resumes": len(state.resumes),
    }


UNREADABLE = "unreadable"  # `kb ls`'s state of a run this kb cannot fold (an event of a newer kb)


def listing_rows(store: Store) -> list[dict[str, Any]]:
    """`kb ls`'s rows: each run's status_dict. A run this kb cannot read (an event of a newer schema, a
    damaged one) is listed with its state UNREADABLE and `error` saying why; the others are unaffected."""
    rows = []
    for rid in store.run_ids():
        state = RunState(rid)
        try:
            store.fold(state, run_id=rid)
            rows.append(status_dict(state))
        except (EventError, UserError) as e:
            problem = state.started.problem_name if state.started is not None else None
            why = (str(e).splitlines() or [type(e).__name__])[0]
            rows.append({"run_id": rid, "problem": problem, "state": UNREADABLE, "error": why})
    return rows


def listing(rows: list[dict[str, Any]]) -> list[str]:
    """`kb ls`'s table: a header, then a row a run, each column as wide as its widest cell (two spaces
    between columns, so long names never run together); an unreadable run's row ends with why."""
    header = ["RUN", "PROBLEM", "STATE", "CANDIDATES", "BEST SCORE", "WINNER"]
    table = []
    for r in rows:
        if r["state"] == UNREADABLE:
            table.append([r["run_id"], r["problem"] or "-", f"{UNREADABLE}: {r['error']}", "", "", ""])
            continue
        best = f"{r['leader_score']:.4g}" if r["leader_score"] is not None else "-"
        cells = [r["run_id"], r["problem"] or "-", r["state"], str(r["candidates"]["proposed"]), best]
        table.append([*cells, r["winner"] or "-"])
    readable = [row for row in table if not row[2].startswith(UNREADABLE)]
    widths = [max(len(row[i]) for row in [header, *readable]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        if row[2].startswith(UNREADABLE):  # its reason is as long as it is, at the end of the line
            return "  ".join([row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2]])
        return "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()

    return [line(header), *map(line, table)]
