"""The gate's judge: a child no candidate code ever runs in. It draws the gate's inputs, keeps the float64
truth and the reference's own outputs, and compares a candidate's outputs with them.

The candidate's child gets the inputs, the init inputs and the reference's weights as a file, and writes
its outputs to another; it never holds the reference Model nor any expected output, so it can neither
sabotage the reference nor return the truth it found in memory.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, NamedTuple

import torch

from kernelbrain.child import guard, tensorfile
from kernelbrain.child.analysis import record_calls
from kernelbrain.child.draws import HEADROOM, SPANS, UPWARD, is_wide, span_limit, variant
from kernelbrain.child.loading import (
    CandidateFault,
    Problem,
    construct,
    draw_digest,
    layout_copy,
    outputs,
    running_state,
    running_state_kept,
    signature,
    to_device,
)
from kernelbrain.child.regime import in_regime
from kernelbrain.child.tolerance import REFERENCE_MULTIPLE, compare, same_as_reference
from kernelbrain.core import handoff
from kernelbrain.core.accuracy import Accuracy
from kernelbrain.core.problem import shape_label
from kernelbrain.core.protocol import DrawsReply, DrawsRequest, GateReply, JudgeRequest, Signature


class Truth(NamedTuple):
    """What a seed's draw at a gate shape is judged by: the float64 reference's outputs on its inputs (the
    truth) and the reference's own at its own dtype (its error is part of the tolerance rule). In training
    mode each list ends with the running state the call left (`running`, loading.running_state's keys),
    one call from the state the model was built with, compared like outputs."""

    truth: list[torch.Tensor]
    native: list[torch.Tensor]
    running: list[str] = []
    spread: list[torch.Tensor] = []  # per element, what one float32 rounding of the inputs moves it (below)


class Drawn(NamedTuple):
    """A problem's draws for the gate: the folder holding their inputs, the reference built per shape,
    the truths kept (within the request's bytes; the others are recomputed from the inputs' file when
    judged), the inputs' fingerprints (a file read back must still hold them), the reply."""

    folder: str
    shapes: list[dict[str, Any]]
    refs: list[torch.nn.Module]
    kept: dict[tuple[int, int], Truth]
    prints: dict[tuple[int, int], str]
    stats: dict[str, tuple[int, int]]  # each file's size and time written: one written since is drawn anew
    reply: DrawsReply
    accuracy: Accuracy | None  # the regime the reference's own outputs were computed in


# the latest problem's draws, for all of its candidates
_KEPT: dict[tuple[str, str, int, str, int, str], Drawn] = {}


def _regime_key(accuracy: Accuracy | None) -> str:
    """What of the regime the draws' truth depends on: the formats the reference's own run used."""
    return "" if accuracy is None else repr(sorted(accuracy.regimes.items())) + repr(accuracy.strict)


def _finite_where_truth_is(t: Truth) -> bool:
    if len(t.native) != len(t.truth):
        return True  # the count is the comparison's to refuse
    pairs = zip(t.native, t.truth, strict=True)
    return all(bool((torch.isfinite(n) | ~torch.isfinite(x)).all()) for n, x in pairs)


def _error(t: Truth) -> float:
    """The reference's normwise relative error against the truth, where the truth is finite (inf where the
    reference is not finite there): ||native - truth|| / ||truth||, scale-free."""
    if len(t.native) != len(t.truth):
        return 0.0
    num = den = 0.0
    for n, x in zip(t.native, t.truth, strict=True):
        finite = torch.isfinite(x)
        d = n.to(torch.float64)[finite] - x[finite]
        if not bool(torch.isfinite(d).all()):
            return math.inf
        num, den = num + float(d.square().sum()), den + float(x[finite].square().sum())
    return math.sqrt(num / den) if den > 0 else 0.0


def _truth(ref: torch.nn.Module, inputs: list[Any], device: str, accuracy: Accuracy | None) -> Truth:
    """The call's truth, and the reference's own outputs in the accuracy regime measured at the primary
    shape (child/regime.py; as it runs here where none was given); the reference's running state is put
    back after it, so every call starts from the state it was built with."""
    ref64 = copy.deepcopy(ref).to(torch.float64)
    with torch.no_grad(), running_state_kept(ref) as running:
        truth = outputs(ref64(*[to_device(x, device, torch.float64) for x in inputs]))
        with in_regime(accuracy):
            native = [n.detach() for n in outputs(ref(*[layout_copy(x) for x in inputs]))]
        state, state64 = ref.state_dict(), ref64.state_dict()
        truth += [state64[k] for k in running]
        native += [state[k].clone() for k in running]
    return Truth(truth, native, running)


def spread(ref: torch.nn.Module, inputs: list[Any], device: str, draw: Truth) -> list[torch.Tensor]:
    """Each compared element's spread (child/tolerance.py): the RMS over NUDGES draws of how far the
    float64 truth moves when the inputs move by about one rounding of their dtype (`nudged`), the error
    scale any correct computation in that dtype has there. Computed where a candidate first fails without
    it (NUDGES more float64 runs of the reference), from the state the reference was built with (each a
    copy of it: the reference itself is not called)."""
    gaps: list[list[torch.Tensor]] = []
    for i in range(NUDGES):
        other = copy.deepcopy(ref).to(torch.float64)
        with torch.no_grad():
            moved = outputs(other(*[nudged(x, device, i) for x in inputs]))
        moved += [other.state_dict()[k] for k in draw.running]
        gaps.append([apart(m, t) for m, t in zip(moved, draw.truth, strict=False)])
    # the RMS: one draw alone is near zero where its random terms happen to cancel
    return [torch.stack(g).square().mean(0).sqrt() for g in zip(*gaps, strict=True)]


NUDGES = 3  # draws of the inputs' rounding a spread is the RMS of (two: 1% of elements near zero)


def nudged(x: Any, device: str, seed: int = 0) -> Any:
    """A floating-point input in float64, each element moved by about one rounding of its dtype: times
    1 + g eps / 2, g standard normal (a fixed draw per seed); others as they are."""
    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return to_device(x, device)
    gen = torch.Generator(device=device).manual_seed(1 + seed)
    g = torch.randn(x.shape, generator=gen, device=device, dtype=torch.float64)
    return x.to(device, torch.float64) * (1 + g * (torch.finfo(x.dtype).eps / 2))


def apart(moved: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """|moved - truth| where both are finite floating point of one shape (0 elsewhere: no allowance)."""
    if not (truth.is_floating_point() and moved.shape == truth.shape):
        return torch.zeros_like(truth, dtype=torch.float64)
    gap = (moved.to(torch.float64) - truth).abs()
    return torch.where(torch.isfinite(gap), gap, 0)


Draw = tuple[list[Any], Truth]
PROBE = 2  # the wide seed the spans are searched on
SANE = 4  # how much worse than at SPANS[0] the reference may err at a wider span


def _try(
    ref: torch.nn.Module,
    own: list[Any],
    device: str,
    seed: int,
    spans: list[float],
    accuracy: Accuracy | None,
) -> Draw:
    inputs = [to_device(x, device) for x in variant(own, seed, spans)]
    return inputs, _truth(ref, inputs, device, accuracy)


def _spans(problem: Problem, ref: torch.nn.Module, shape: dict[str, Any], device: str) -> list[float]:
    """Each input's span (kernelbrain/child/draws.py), searched on the wide seed PROBE's draw. Where the
    reference is finite wherever the float64 truth is at SPANS[0] (else the seeds' draws narrow it down
    SPANS), each floating-point input's goes up through UPWARD, the others held, while the reference
    stays finite there and right: its normwise error against the truth no more than SANE times its
    error at SPANS[0] (or its dtype's tolerance). Finite is not enough: a bfloat16 attention's reference
    whose scores overflow returns finite values wrong by 100%. One float64 run a step, on the fitted gate
    shape, once a problem. What is found is divided by HEADROOM."""
    own = problem.inputs(shape, PROBE, device)
    spans = [SPANS[0]] * len(own)
    base = _try(ref, own, device, PROBE, spans, problem.accuracy)[1]
    if not _finite_where_truth_is(base):
        return spans
    dtypes = [n.dtype for n in base.native] or [torch.float32]
    bound = max(SANE * _error(base), max(problem.tolerance_of(d) for d in dtypes))
    del base
    for i, x in enumerate(own):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            continue
        for up in UPWARD:
            if up > span_limit(x.dtype):
                break
            wider = [*spans[:i], up, *spans[i + 1 :]]
            tried = _try(ref, own, device, PROBE, wider, problem.accuracy)[1]
            if not _finite_where_truth_is(tried) or _error(tried) > bound:
                break
            spans = wider
    return [max(SPANS[0], s / HEADROOM) for s in spans]


def _draw(
    problem: Problem, ref: torch.nn.Module, shape: dict[str, Any], device: str, seed: int, spans: list[float]
) -> Draw:
    """A seed's inputs at a gate shape and their truth, within the inputs' spans; where this draw takes
    the reference past finite (another seed than the probe's), spans narrowed down SPANS."""
    own = problem.inputs(shape, seed, device)
    if seed == 0:
        inputs = [to_device(x, device) for x in own]
        return inputs, _truth(ref, inputs, device, problem.accuracy)
    for cap in (math.inf, *SPANS):
        drawn = _try(ref, own, device, seed, [min(s, cap) for s in spans], problem.accuracy)
        if _finite_where_truth_is(drawn[1]):
            break
    return drawn


def _stats(folder: str) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in Path(folder).glob("*.pt")}


def _size(t: Truth) -> int:
    return sum(x.numel() * x.element_size() for x in (*t.truth, *t.native, *t.spread))


def draws(request: DrawsRequest) -> DrawsReply:
    """The gate's draws of a problem, written one file a shape and seed into `folder` (the candidate's
    child reads them there) and drawn once for all of its candidates: the reference runs once a seed and
    shape, whoever is gated, and only one draw is in memory at a time. Truth past `keep_bytes` is
    recomputed from the inputs' file for each candidate rather than held. A different problem replaces
    them."""
    device, seeds, folder = request.device, request.seeds, request.folder
    problem = Problem(request.problem_source)
    key = (problem.hash, device, seeds, folder, request.keep_bytes, _regime_key(problem.accuracy))
    if key in _KEPT and _KEPT[key].stats == _stats(folder):
        return _KEPT[key].reply
    _KEPT.clear()
    for old in Path(folder).glob("*.pt"):
        old.unlink()
    shapes = problem.gate_shapes(device)
    refs, kept, prints, forbidden = [], {}, {}, []
    held = 0
    for i, shape in enumerate(shapes):
        init = problem.init_inputs(shape)
        ref = construct(problem.module.Model, init, device, eval_mode=problem.eval_mode)
        refs.append(ref)
        state = {k: v.detach() for k, v in ref.state_dict().items()}
        entry = {
            "init": init,
            "state": state,
            "eval": not ref.training,  # the candidate in the reference's mode (a constructor may choose eval)
            "running": sorted(running_state(ref, compared=True)),
        }
        torch.save(entry, handoff.init_file(folder, i))
        spans = _spans(problem, ref, shape, device) if seeds > 1 else []
        for seed in range(seeds):
            inputs, truth = _draw(problem, ref, shape, device, seed, spans)
            torch.save(inputs, handoff.inputs_file(folder, i, seed))
            prints[(i, seed)] = draw_digest(inputs)
            if seed == 0:  # traced on a copy of the problem's own draw: no second draw for it
                with running_state_kept(ref):
                    traced = record_calls(ref, [layout_copy(x) for x in inputs])
                forbidden.append(sorted(guard.forbidden_ops(traced)))
            if held + _size(truth) <= request.keep_bytes:
                kept[(i, seed)] = truth
                held += _size(truth)
            del inputs, truth
    model = problem.module.Model
    reply = DrawsReply(
        shapes=[shape_label(s) for s in shapes],
        signature=Signature(
            init=[n for n, _ in signature(model.__init__)], forward=[n for n, _ in signature(model.forward)]
        ),
        forbidden=forbidden,
        prints=[[prints[(i, seed)] for seed in range(seeds)] for i in range(len(shapes))],
    )
    _KEPT[key] = Drawn(folder, shapes, refs, kept, prints, _stats(folder), reply, problem.accuracy)
    return reply


def _load_outputs(path: Path, device: str) -> list[torch.Tensor]:
    """A trial's outputs at one shape and seed, read as raw bytes after their header is validated (no
    code of the candidate's runs here)."""
    try:
        return tensorfile.read(path, device)
    except tensorfile.Unreadable as e:
        raise CandidateFault("runtime", f"its outputs could not be read back: {e}") from None


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.equal(x.to(y.dtype), y) for x, y in zip(a, b, strict=True)
    )


def judge(request: JudgeRequest) -> GateReply:
    """A trial's outputs against the truth of the problem's draws: the gate's verdict."""
    device, seeds = request.device, request.seeds
    problem = Problem(request.problem_source)
    drawn = next(
        (d for k, d in _KEPT.items() if k[:4] == (problem.hash, device, seeds, request.folder)), None
    )
    if drawn is None:
        raise RuntimeError("judge: no draws kept for this problem (a draws request comes first)")
    try:
        return _judge(problem, drawn, device, seeds, Path(request.outputs_dir))
    except CandidateFault as f:
        return GateReply(
            passed=False,
            category=f.category,
            detail=f.detail,
            max_abs_err=f.max_abs_err,
            max_rel_err=f.max_rel_err,
        )


def _truth_of(drawn: Drawn, shape: int, seed: int, device: str) -> Truth:
    kept = drawn.kept.get((shape, seed))
    if kept is not None:
        return kept
    return _truth(drawn.refs[shape], _inputs_of(drawn, shape, seed, device), device, drawn.accuracy)


def _spread_of(drawn: Drawn, shape: int, seed: int, device: str, draw: Truth) -> Truth:
    """The draw with its spread (`spread`), kept with it where its truth is kept."""
    inputs = _inputs_of(drawn, shape, seed, device)
    draw = draw._replace(spread=spread(drawn.refs[shape], inputs, device, draw))
    if (shape, seed) in drawn.kept:
        drawn.kept[(shape, seed)] = draw
    return draw


def _inputs_of(drawn: Drawn, shape: int, seed: int, device: str) -> list[Any]:
    """A draw's inputs read back from the file the judge wrote, checked against its fingerprint."""
    path = handoff.inputs_file(drawn.folder, shape, seed)
    inputs = torch.load(path, map_location=device, weights_only=False)
    if draw_digest(inputs) != drawn.prints[(shape, seed)]:
        # only a candidate's child can write there, and only where the sandbox does not bind it read-only
        _KEPT.clear()  # drawn afresh for the next candidate
        raise CandidateFault(
            "policy",
            f"the gate's inputs file {path.name} changed after the judge wrote it: the candidate did it",
        )
    return list(inputs)


def _named(k: int, draw: Truth) -> str:
    """What the k-th compared tensor is: an output, or the running state a training-mode call updates."""
    n = len(draw.truth) - len(draw.running)
    return f"output {k}" if k < n else f"running state {draw.running[k - n]} (updated in training mode)"


def _judge(problem: Problem, drawn: Drawn, device: str, seeds: int, handed: Path) -> GateReply:
    """The passing verdict with its worst errors; a CandidateFault at the first check that fails."""
    worst_abs = worst_rel = tol = 0.0
    for i, shape in enumerate(drawn.shapes):
        where = f"shape {shape_label(shape)}, " if len(drawn.shapes) > 1 else ""
        previous: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        for seed in range(seeds):
            got = _load_outputs(handoff.outputs_file(handed, i, seed), device)
            draw = _truth_of(drawn, i, seed, device)
            expected = draw.truth
            if len(got) != len(expected):  # the candidate's child writes the running state the judge names
                n = len(expected) - len(draw.running)
                raise CandidateFault(
                    "mismatch", f"{len(got) - len(draw.running)} outputs, the reference returns {n}"
                )
            # the previous call's outputs again for inputs whose truth moved: a failure below is caching;
            # outputs that still pass were right (an output independent of its inputs, up to rounding)
            cached = previous is not None and _same(got, previous[0]) and not _same(expected, previous[1])
            previous = (got, expected)
            for k, (g, e) in enumerate(zip(got, expected, strict=True)):
                same_as_reference(k, g, draw.native[k])
                tol = problem.tolerance_of(
                    draw.native[k].dtype
                )  # the reference's dtype, never the candidate's
                c = compare(g, e, draw.native[k], tol, draw.spread[k] if draw.spread else None)
                if c.failed and not draw.spread:  # the spread floors the bound: computed where it may matter
                    draw = _spread_of(drawn, i, seed, device, draw)
                    c = compare(g, e, draw.native[k], tol, draw.spread[k])
                if cached and (c.unwritten or c.failed):
                    raise CandidateFault(
                        "policy",
                        f"{where}seed {seed}: fresh inputs gave the previous call's outputs "
                        "(results cached across calls)",
                    )
                if c.unwritten:
                    raise CandidateFault(
                        "nan",
                        f"{where}seed {seed}: {_named(k, draw)} has {c.unwritten} NaN/Inf where the "
                        "reference has none (outputs are allocated NaN-filled: are some elements never "
                        "written? Or did it overflow?)",
                    )
                if not is_wide(seed):  # the wide draws' errors measure the draw more than the kernel
                    worst_abs, worst_rel = max(worst_abs, c.max_abs_err), max(worst_rel, c.max_rel_err)
                if c.failed:
                    raise CandidateFault(
                        "mismatch",
                        f"{where}seed {seed}: {_named(k, draw)} differs from the reference at {c.failed} of "
                        f"{c.numel} elements (max abs err {c.max_abs_err:.3g}, tolerance {tol:g} or "
                        f"{REFERENCE_MULTIPLE}x the reference's own error)",
                        max_abs_err=c.max_abs_err,
                        max_rel_err=c.max_rel_err,
                    )
    return GateReply(
        passed=True,
        seeds=seeds,
        max_abs_err=worst_abs,
        max_rel_err=worst_rel,
        tolerance=tol,
        shapes=[shape_label(s) for s in drawn.shapes],
    )
