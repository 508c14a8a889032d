"""`kb audit`: why the winner won, in readable text, from the log alone."""

from __future__ import annotations

from kernelbrain.core import torch_ops
from kernelbrain.core.errors import RunError
from kernelbrain.core.events import GatePassed
from kernelbrain.core.state import Candidate, RunState
from kernelbrain.views.describe import fmt_s, knobs_text


def _lineage(state: RunState, c: Candidate) -> list[Candidate]:
    chain = [c]
    while chain[-1].proposal.parent and chain[-1].proposal.parent in state.candidates:
        chain.append(state.candidates[chain[-1].proposal.parent])
    return chain[::-1]


def audit(state: RunState, candidate: str | None = None) -> str:
    if state.started is None:
        raise RunError(f"run {state.run_id} has no RunStarted event")
    cid = candidate or (state.finished.winner if state.finished else None)
    if cid is None:
        leader = state.leader()
        cid = leader.id if leader else None
    if cid is None:
        raise RunError(f"run {state.run_id} has no measured candidate to audit yet")
    if cid not in state.candidates:
        raise RunError(f"run {state.run_id} has no candidate {cid!r}; `kb status {state.run_id}` lists them")
    c = state.candidates[cid]
    cfg = state.config
    lines = [
        f"Run {state.run_id}: problem {state.started.problem_name} on {cfg.device}, generator "
        f"{cfg.generator}, seed {cfg.seed}, eta {cfg.eta}, {len(cfg.rungs)} rungs, "
        f"policy v{cfg.policy_version}"
        + (f", torch allowed for {', '.join(cfg.allow_torch)} (--allow-torch)" if cfg.allow_torch else "")
    ]
    if state.finished:
        lines.append(f"Finished: {state.finished.reason}")
        if state.finished.note:
            lines.append(f"Winner vs runner-up: {state.finished.note}")
    role = "Winner" if state.finished and state.finished.winner == cid else "Candidate"
    lines.append(f"{role}: {cid} ({c.proposal.family}/{c.proposal.strategy}: {knobs_text(c)})")
    lines.append(f"Runs in torch: {_torch_note(c)}")
    lines += _plan(c)

    lines.append("\nLineage (root first):")
    for depth, a in enumerate(_lineage(state, c)):
        why = a.proposal.hint
        diag = f" [parent's diagnosis: {', '.join(a.proposal.diagnosis)}]" if a.proposal.diagnosis else ""
        lines.append(
            f"{'  ' * depth}- {a.id} round {a.proposal.round} by {a.proposal.generator}: {why}{diag}"
        )

    lines.append("\nGate:")
    if state.analysis is not None and state.analysis.accuracy is not None:
        lines.append(f"  accuracy contract: {state.analysis.accuracy.summary()}")
    if isinstance(c.gate, GatePassed):
        lines.append(
            f"  passed on {c.gate.seeds} seeds; max abs err {c.gate.max_abs_err:.3g}, max rel err "
            f"{c.gate.max_rel_err:.3g} (tolerance {c.gate.tolerance:g})"
        )
    elif c.gate is not None:
        lines.append(f"  FAILED [{c.gate.category}]: {c.gate.detail}")
    else:
        lines.append("  not gated yet")

    lines.append("\nLadder:")
    for rung in sorted(c.results):
        r = c.results[rung]
        spec = cfg.rungs[rung]
        lines.append(
            f"  rung {rung} ({spec.shapes} shapes, {spec.repeats} repeats, {r.timer}): score {r.score:.4g}"
        )
        for s in r.shapes:
            wall = "" if s.wall_speedup is None else f" ({s.wall_speedup:.3g}x on the worker's clock)"
            lines.append(
                f"    {s.shape}: {fmt_s(s.cand_median_s)} (IQR {fmt_s(s.cand_iqr_s)}) vs reference "
                f"{fmt_s(s.ref_median_s)} (IQR {fmt_s(s.ref_iqr_s)}) over {s.repeats} repeats: "
                f"{s.speedup:.3g}x{wall}"
            )
        if rung in c.promotions:
            p = c.promotions[rung]
            peers = ", ".join(f"{k} {v:.4g}" for k, v in p.peers.items())
            more = f" and {p.n_peers - len(p.peers)} more" if p.n_peers > len(p.peers) else ""
            lines.append(
                f"    promoted to rung {p.rung_to}: rank {p.rank} of {p.n_peers}, top {p.keep} kept "
                f"(threshold {p.threshold:.4g}); peers: {peers}{more}"
            )
            if p.note:
                lines.append(f"    noise adjudication: {p.note}")
    if c.bench_failed:
        lines.append(
            f"  rung {c.bench_failed.rung} FAILED [{c.bench_failed.category}]: {c.bench_failed.detail}"
        )
    if c.pruned:
        lines.append(f"  pruned: {c.pruned.reason}")

    if c.profile:
        metrics = ", ".join(f"{k}={v:.3g}" for k, v in sorted(c.profile.metrics.items()))
        lines.append(f"\nProfile ({c.profile.source}): {', '.join(c.profile.labels)}\n  {metrics}")
        children = [k for k in state.candidates.values() if k.proposal.parent == cid]
        for k in children:
            lines.append(f"  mutation {k.id}: {k.proposal.hint} -> {k.terminal or 'in progress'}")

    lines.append("\nRunners-up:")
    others = [o for o in state.candidates.values() if o.id != cid]
    if not others:
        lines.append("  none")
    for o in sorted(
        others, key=lambda o: (-max(o.results, default=-1), -(o.top_result.score if o.top_result else 0))
    ):
        labelled = f" [{torch_ops.label(o.proposal.torch_ops)}]" if o.proposal.torch_ops else ""
        lines.append(f"  {o.id} ({o.proposal.strategy}: {knobs_text(o)}){labelled}: {_beaten_by(c, o)}")
    return "\n".join(lines)


def _plan(c: Candidate) -> list[str]:
    """The candidate's launches in order (its plan), one a line: stage, family, knobs, what it reads and
    writes; nothing where its generator recorded none."""
    if not c.proposal.plan:
        return []
    out = [f"Plan: {len(c.proposal.plan)} launch{'es' if len(c.proposal.plan) > 1 else ''}"]
    for launch in c.proposal.plan:
        knobs = ", ".join(f"{k}={v}" for k, v in launch.knobs.items())
        out.append(
            f"  {launch.stage}: {launch.family} ({knobs}) reads {', '.join(launch.reads)} -> {launch.writes}"
        )
    return out


def _torch_note(c: Candidate) -> str:
    """What of the problem's compute the candidate keeps in PyTorch: its label, which the gate enforced."""
    if not c.proposal.torch_ops:
        return "nothing: all its compute is its own Triton kernels"
    ops = ", ".join(c.proposal.torch_ops)
    return f"{ops} (a partial kernel: the gate admits only their ATen ops beside its Triton kernels)"


def _beaten_by(c: Candidate, o: Candidate) -> str:
    if o.gate is not None and o.gate.TYPE == "GateFailed":
        return f"gate failed [{o.gate.category}]: {o.gate.detail}"
    if not o.results:
        return o.terminal or "not measured yet"
    rung = max(o.results)
    mine = c.results.get(rung)
    theirs = o.results[rung].score
    vs = (
        f"score {theirs:.4g} at rung {rung} vs {mine.score:.4g}"
        if mine
        else f"score {theirs:.4g} at rung {rung}"
    )
    tail = f"; {o.pruned.reason}" if o.pruned else (f"; {o.terminal}" if o.terminal else "")
    return vs + tail
