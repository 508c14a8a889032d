"""The gate's judge: a child no candidate code ever runs in. It draws the gate's inputs, keeps the float64
truth and the reference's own outputs, and compares a candidate's outputs with them.

The candidate's child gets the inputs, the init inputs and the reference's weights as a file, and writes
its outputs to another; it never holds the reference Model nor any expected output, so it can neither
sabotage the reference nor return the truth it found in memory.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import torch

from kernelbrain.child import guard
from kernelbrain.child.analysis import record_calls
from kernelbrain.child.loading import (
    SPANS,
    CandidateFault,
    Problem,
    construct,
    layout_copy,
    outputs,
    signature,
    to_device,
    variant,
)
from kernelbrain.child.tolerance import REFERENCE_MULTIPLE, compare
from kernelbrain.core.problem import shape_label


class Draw(NamedTuple):
    """A seed's inputs at a gate shape, the float64 reference's outputs on them (the truth), and the
    reference's own at its own dtype (its error is part of the tolerance rule)."""

    inputs: list
    truth: list[torch.Tensor]
    native: list[torch.Tensor]


class Drawn(NamedTuple):
    """A problem's draws for the gate, and the reply that names the file the candidate's child reads."""

    shapes: list[dict]
    draws: list[list[Draw]]  # per shape, per seed
    reply: dict


_KEPT: dict[tuple, Drawn] = {}  # the latest problem's draws, for all of its candidates


def _finite_where_truth_is(draw: Draw) -> bool:
    pairs = zip(draw.native, draw.truth, strict=True)
    return all(bool((torch.isfinite(n) | ~torch.isfinite(t)).all()) for n, t in pairs)


def _draw(problem: Problem, ref: torch.nn.Module, shape: dict, device: str, seed: int) -> Draw:
    """A seed's draw at a gate shape. A wide-range seed takes the widest span on which the reference
    stays finite wherever the truth is."""
    ref64 = copy.deepcopy(ref).to(torch.float64)
    own = problem.inputs(shape, seed, device)
    for span in SPANS if seed and seed % 2 == 0 else SPANS[:1]:
        inputs = [to_device(x, device) for x in variant(own, seed, span)]
        with torch.no_grad():
            truth = outputs(ref64(*[to_device(x, device, torch.float64) for x in inputs]))
            native = outputs(ref(*[layout_copy(x) for x in inputs]))
        draw = Draw(inputs, truth, [n.detach() for n in native])
        if len(native) != len(truth) or _finite_where_truth_is(draw):
            break
    return draw


def draws(problem_source: str, device: str, seeds: int) -> dict:
    """The gate's draws of a problem: computed once and kept for its candidates (the reference runs once
    a seed and shape, whoever is gated); a different problem replaces them."""
    problem = Problem(problem_source)
    key = (problem.hash, device, seeds)
    if key in _KEPT:
        return _KEPT[key].reply
    _KEPT.clear()
    shapes = problem.gate_shapes(device)
    kept, sent, forbidden = [], [], []
    for shape in shapes:
        init = problem.init_inputs(shape)
        ref = construct(problem.module.Model, init, device)
        per_seed = [_draw(problem, ref, shape, device, seed) for seed in range(seeds)]
        # traced on a copy of seed 0's draw, the problem's own: no second draw for it
        traced = record_calls(ref, [layout_copy(x) for x in per_seed[0].inputs])
        forbidden.append(sorted(guard.forbidden_ops(traced)))
        kept.append(per_seed)
        state = {k: v.detach() for k, v in ref.state_dict().items()}
        sent.append({"init": init, "state": state, "inputs": [d.inputs for d in per_seed]})
    path = Path(tempfile.gettempdir()) / f"draws-{problem.hash[:16]}-{device}-{seeds}.pt"
    torch.save(sent, path)
    model = problem.module.Model
    reply = {
        "path": str(path),
        "shapes": [shape_label(s) for s in shapes],
        "signature": {
            "init": [n for n, _ in signature(model.__init__)],
            "forward": [n for n, _ in signature(model.forward)],
        },
        "forbidden": forbidden,
    }
    _KEPT[key] = Drawn(shapes, kept, reply)
    return reply


def _load_outputs(path: str, device: str, shapes: int, seeds: int) -> list[list[list[torch.Tensor]]]:
    """A trial's outputs, read as data only (weights_only: no code of the candidate's runs here)."""
    try:
        got = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        raise CandidateFault("runtime", f"its outputs could not be read back: {type(e).__name__}: {e}") from e
    ok = (
        isinstance(got, list)
        and len(got) == shapes
        and all(isinstance(s, list) and len(s) == seeds for s in got)
        and all(isinstance(o, list) and all(type(t) is torch.Tensor for t in o) for s in got for o in s)
    )
    if not ok:
        raise CandidateFault(
            "runtime", "its outputs file does not hold one list of tensors per shape and seed"
        )
    return got


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.equal(x.to(y.dtype), y) for x, y in zip(a, b, strict=True)
    )


def judge(problem_source: str, device: str, seeds: int, outputs_path: str) -> dict:
    """A trial's outputs against the truth kept for the problem's draws: the gate's verdict."""
    problem = Problem(problem_source)
    drawn = _KEPT.get((problem.hash, device, seeds))
    if drawn is None:
        raise RuntimeError("judge: no draws kept for this problem (a draws request comes first)")
    try:
        return {"passed": True, **_judge(problem, drawn, device, seeds, outputs_path)}
    except CandidateFault as f:
        return {"passed": False, "category": f.category, "detail": f.detail, **f.figures}


def _judge(problem: Problem, drawn: Drawn, device: str, seeds: int, path: str) -> dict[str, Any]:
    got_all = _load_outputs(path, device, len(drawn.shapes), seeds)
    worst_abs = worst_rel = tol = 0.0
    for shape, per_seed, got_seeds in zip(drawn.shapes, drawn.draws, got_all, strict=True):
        where = f"shape {shape_label(shape)}, " if len(drawn.shapes) > 1 else ""
        previous: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        for seed, (draw, got) in enumerate(zip(per_seed, got_seeds, strict=True)):
            expected = draw.truth
            if len(got) != len(expected):
                raise CandidateFault("mismatch", f"{len(got)} outputs, the reference returns {len(expected)}")
            if previous is not None and _same(got, previous[0]) and not _same(expected, previous[1]):
                raise CandidateFault(
                    "policy",
                    f"{where}seed {seed}: fresh inputs gave the previous call's outputs "
                    "(results cached across calls)",
                )
            previous = (got, expected)
            for i, (g, e) in enumerate(zip(got, expected, strict=True)):
                if g.shape != e.shape:
                    raise CandidateFault(
                        "mismatch", f"output {i} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
                    )
                tol = problem.tolerance_of(g.dtype)
                c = compare(g, e, draw.native[i], tol)
                if c.unwritten:
                    raise CandidateFault(
                        "nan",
                        f"{where}seed {seed}: output {i} has {c.unwritten} NaN/Inf where the reference has "
                        "none (outputs are allocated NaN-filled: are some elements never written? Or did it "
                        "overflow?)",
                    )
                worst_abs, worst_rel = max(worst_abs, c.max_abs_err), max(worst_rel, c.max_rel_err)
                if c.failed:
                    raise CandidateFault(
                        "mismatch",
                        f"{where}seed {seed}: output {i} differs from the reference at {c.failed} of "
                        f"{c.numel} elements (max abs err {c.max_abs_err:.3g}, tolerance {tol:g} or "
                        f"{REFERENCE_MULTIPLE}x the reference's own error)",
                        max_abs_err=c.max_abs_err,
                        max_rel_err=c.max_rel_err,
                    )
    return {"seeds": seeds, "max_abs_err": worst_abs, "max_rel_err": worst_rel, "tolerance": tol}
