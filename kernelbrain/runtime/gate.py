"""V(p) across two sandboxed children, the host's side of the gate.

The judge (a child no candidate code ever runs in) draws the inputs into a folder the candidate's child
sees read-only, and keeps the truth; the candidate's child runs the candidate on them and writes its
outputs; the judge compares them. The candidate's process never holds the reference nor an expected
output. kernelbrain/child/judge.py and child/gate.py are the two children's sides.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from kernelbrain.core import handoff
from kernelbrain.core.protocol import (
    DrawsRequest,
    GateReply,
    GateRequest,
    JudgeRequest,
    KernelSignature,
    LaunchersRequest,
    TrialReply,
    TrialRequest,
)
from kernelbrain.runtime import scratch, triton_cache
from kernelbrain.runtime.faults import ProblemFault, SandboxError, SandboxFault

if TYPE_CHECKING:
    from kernelbrain.runtime.sandbox import Sandbox

# the truth (float64 outputs and the reference's own) a judge holds for a problem's next candidates; a
# draw past it is recomputed for each candidate from its inputs' file
JUDGE_KEEP_BYTES = {"cuda": 8 << 30, "cpu": 1 << 30}


def gate(
    box: Sandbox, request: GateRequest, *, timeout_s: float, task: str = "-", own_code: bool = False
) -> tuple[GateReply, float]:
    """V(p) on `box`'s child and its judge; the verdict and the busy seconds of both. A fault of the
    judge's (the problem's reference) is kb's side, not the candidate's. What a passing trial compiled is
    kept for the children that time it, and shared with every child where the trial's process ran only
    kb's own code."""
    started = time.perf_counter()
    judge = box.start_judge()
    draws, outbox = box.gate_folders()
    keep = JUDGE_KEEP_BYTES.get(request.device, 0)
    # the device's lock: held through the judge's requests (the problem's code on the device) and a trial
    # of code from outside; a trial of kb's own code takes and lets it go as its child marks
    # (runtime/gpu_lock.py), so its load and compiles leave the device to the others
    hold = box.hold
    pinned = hold.pinned if hold is not None else contextlib.nullcontext
    marked = own_code and box.own_code_only
    try:
        with pinned():
            drawn, busy = judge.ask(
                DrawsRequest(
                    problem_source=request.problem_source,
                    device=request.device,
                    fits=request.fits,
                    accuracy=request.accuracy,
                    seeds=request.seeds,
                    folder=str(draws),
                    keep_bytes=keep,
                ),
                timeout_s=timeout_s,
                task=task,
            )
    except (SandboxFault, SandboxError) as e:  # the draws run the problem's code, no candidate's
        raise ProblemFault(f"the gate's judge failed drawing the problem's inputs: {e}") from None
    box.gate_phases = {"draws": busy}
    if box.proc is not None and str(outbox) not in box.bound:
        box.stop()  # started before the judge: it cannot see the draws
    box.bring_compiled([])  # what this child's cache holds after the trial is this candidate's
    scratch.empty(outbox)  # an earlier candidate's outputs
    with contextlib.nullcontext() if marked else pinned():
        trial, busy_trial = box.ask(
            TrialRequest(
                cand_source=request.cand_source,
                device=request.device,
                folder=str(draws),
                outbox=str(outbox),
                prints=drawn.prints,
                keep_bytes=keep,
                shapes=drawn.shapes,
                signature=drawn.signature,
                forbidden=drawn.forbidden,
                seeds=request.seeds,
                torch_ops=request.torch_ops,
            ),
            timeout_s=timeout_s,
            task=task,
            hold=True,
            own_code=own_code,
        )
    box.gate_phases["trial"] = busy_trial
    box.gate_phases.update({f"trial.{k}": v for k, v in trial.steps.items()})
    if not (own_code and box.own_code_only):  # else the trial's own launchers are shared (below)
        busy_trial += build_launchers(box, trial.launchers, timeout_s, task)
    # a child a candidate from outside ran in (or one that changed process-wide state) is stopped before
    # the judge reads its outputs: nothing of the candidate's runs on while they are read. Its Triton
    # cache is moved aside first, to keep what a passing trial compiled for the children that time it
    kept = scratch.make("sandbox") if box.recycle_due and box.own_cache() is not None else None
    try:
        try:
            handed = _handed(outbox, trial, len(drawn.shapes), request.seeds)
        finally:
            box.recycle(keep_cache=None if kept is None else kept / "triton")
        if handed is None:
            return GateReply(passed=False, category=trial.category, detail=trial.detail), busy + busy_trial
        with pinned():
            verdict, busy_judge = judge.ask(
                JudgeRequest(
                    problem_source=request.problem_source,
                    device=request.device,
                    fits=request.fits,
                    accuracy=request.accuracy,
                    seeds=request.seeds,
                    folder=str(draws),
                    outputs_dir=str(handed),
                ),
                timeout_s=timeout_s,
                task=task,
            )
        box.gate_phases.update(judge=busy_judge)
        if verdict.passed:
            if kept is not None:
                triton_cache.keep_compiled(kept / "triton", request.cand_source)
            else:
                box.keep_compiled(request.cand_source)
            if own_code and box.own_code_only:
                box.share_compiled()
    finally:
        if kept is not None:
            scratch.remove(kept)
    box.gate_phases["wall"] = time.perf_counter() - started
    return verdict, busy + busy_trial + busy_judge


def _handed(outbox: Path, trial: TrialReply, shapes: int, seeds: int) -> Path | None:
    """The outbox, where the trial wrote its outputs for the judge (a folder the judge reads, no copy);
    None where the trial failed a check."""
    if trial.folder is None:
        return None
    if Path(trial.folder) != outbox:
        raise SandboxFault("runtime", f"its outputs were not written in the outbox ({trial.folder})")
    for shape in range(shapes):
        for seed in range(seeds):
            data = handoff.outputs_file(outbox, shape, seed)
            for f in (data, handoff.header_of(data)):
                if f.is_symlink() or not f.is_file():
                    raise SandboxFault("runtime", f"it wrote no outputs file {f.name}")
    return outbox


def build_launchers(box: Sandbox, signatures: list[KernelSignature], timeout_s: float, task: str) -> float:
    """The judge builds Triton's launchers for a trial's kernel signatures, and they are kept for the
    children after (under bubblewrap: the other levels share the host's cache); its busy seconds."""
    keyed = {orjson.dumps(s).decode(): s for s in signatures}
    new = {k: s for k, s in keyed.items() if k not in box.built}
    if not new or box.own_cache() is None or box.judge is None:
        return 0.0
    box.built.update(new)
    try:
        _, busy = box.judge.ask(
            LaunchersRequest(signatures=list(new.values())), timeout_s=timeout_s, task=task
        )
    except (SandboxFault, SandboxError):  # an optimisation only: the next candidate builds its own
        return 0.0
    judge_cache = box.judge.own_cache()
    if judge_cache is not None:
        triton_cache.keep_launchers(judge_cache)
    box.gate_phases["launchers"] = busy
    return busy
