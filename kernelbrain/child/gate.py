"""The gate V(p): the candidate compiles, matches the signature, obeys the policy, and matches the float64
reference on several draws."""

from __future__ import annotations

import ast
import copy
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import torch

from kernelbrain.child import guard
from kernelbrain.child.analysis import record_calls
from kernelbrain.child.loading import (
    SPANS,
    CandidateFault,
    Problem,
    build_guarded,
    check_reference,
    fingerprint,
    layout_copy,
    load_module,
    outputs,
    signature,
    tensors,
    to_device,
    variant,
)
from kernelbrain.child.tolerance import REFERENCE_MULTIPLE, compare
from kernelbrain.core.problem import shape_label


def _has_jit_kernel(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                if name == "jit":
                    return True
    return False


def _load_candidate(cand_source: str) -> ModuleType:
    try:
        tree = ast.parse(cand_source, "<candidate>")
    except SyntaxError as e:
        raise CandidateFault("compile", f"line {e.lineno}: {e.msg}") from e
    if not _has_jit_kernel(tree):
        raise CandidateFault(
            "policy", "no @triton.jit kernel: a candidate's work must be done by Triton kernels"
        )
    guard.install()
    try:
        return load_module(cand_source, "cand")
    except Exception as e:
        raise CandidateFault("compile", f"importing the candidate failed: {type(e).__name__}: {e}") from e


def _check_signature(problem: Problem, cand: ModuleType) -> None:
    new_cls = getattr(cand, "ModelNew", None)
    if not inspect.isclass(new_cls) or not issubclass(new_cls, torch.nn.Module):
        raise CandidateFault("signature", "the candidate defines no class ModelNew(nn.Module)")
    ref_cls = problem.module.Model
    for method in ("__init__", "forward"):
        want, got = signature(getattr(ref_cls, method)), signature(getattr(new_cls, method))
        if [n for n, _ in want] != [n for n, _ in got]:
            raise CandidateFault(
                "signature",
                f"ModelNew.{method}({', '.join(n for n, _ in got)}) differs from "
                f"Model.{method}({', '.join(n for n, _ in want)})",
            )


def _policy(check: Callable[..., None], *args: Any, prefix: str = "") -> None:
    try:
        check(*args)
    except guard.Violation as v:
        raise CandidateFault("policy", f"{prefix}{v}") from None


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.equal(x.to(y.dtype), y) for x, y in zip(a, b, strict=True)
    )


class Memo:
    """What the gate computes from the problem alone, kept for the child's next candidates: the float64
    reference's outputs on each seed's inputs, and the torch ops the reference calls. Every candidate of
    a run is checked against the same draws, so each costs one reference run, not one per candidate.
    A different problem clears it; a draw over the byte limit is recomputed rather than held. Each
    entry's fingerprint is checked after every candidate (`intact`): a kernel that writes outside its
    outputs may land in memory the memo holds."""

    LIMIT_BYTES = {"cuda": 8 << 30, "cpu": 1 << 30}

    def __init__(self) -> None:
        self.problem = ""
        self.entries: dict[tuple, tuple[Any, list[tuple]]] = {}
        self.bytes = 0

    def get(self, problem: str, key: tuple, make: Callable[[], Any]) -> Any:
        if problem != self.problem:
            self.clear(problem)
        if key in self.entries:
            return self.entries[key][0]
        value = make()
        kept = tensors(value)
        size = sum(t.numel() * t.element_size() for t in kept)
        if self.bytes + size <= self.LIMIT_BYTES.get(kept[0].device.type if kept else "cpu", 1 << 30):
            self.entries[key] = (value, [fingerprint(t) for t in kept])
            self.bytes += size
        return value

    def clear(self, problem: str = "") -> None:
        self.problem, self.entries, self.bytes = problem, {}, 0

    def intact(self) -> bool:
        """Whether every kept tensor still holds what it held when kept; if not, the memo is emptied."""
        ok = all(
            [fingerprint(t) for t in tensors(value)] == prints for value, prints in self.entries.values()
        )
        if not ok:
            self.clear()
        return ok


_MEMO = Memo()


class Draw(NamedTuple):
    """A seed's inputs at a gate shape, the float64 reference's outputs on them (the truth), and the
    reference's own at its own dtype (its error is part of the tolerance rule)."""

    inputs: list
    truth: list[torch.Tensor]
    native: list[torch.Tensor]


def _finite_where_truth_is(draw: Draw) -> bool:
    pairs = zip(draw.native, draw.truth, strict=True)
    return all(bool((torch.isfinite(n) | ~torch.isfinite(t)).all()) for n, t in pairs)


def _reference_draw(
    problem: Problem, ref: torch.nn.Module, shape: dict, device: str, seed: int, weights: tuple
) -> Draw:
    """A seed's draw at a gate shape, from the memo. A wide-range seed takes the widest span on which the
    reference stays finite wherever the truth is. `weights` (fingerprints of the reference's
    state_dict) is part of the key: a Model whose init does not follow torch.manual_seed (numpy, say)
    gets a new reference with each build."""

    def make() -> Draw:
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

    return _MEMO.get(problem.hash, ("draw", device, shape_label(shape), seed, weights), make)


def gate(problem_source: str, cand_source: str, device: str, seeds: int) -> dict:
    """V(p): compiles, signature matches, outputs match the float64 reference on several draws."""
    try:
        result = {"passed": True, **_gate(Problem(problem_source), cand_source, device, seeds)}
    except CandidateFault as f:
        result = {"passed": False, "category": f.category, "detail": f.detail, **f.figures}
    if not _MEMO.intact() and result["passed"]:
        result = {
            "passed": False,
            "category": "runtime",
            "detail": "memory outside the candidate's outputs changed while it ran (the gate's kept inputs "
            "or reference outputs): an out-of-bounds write? Check its masks",
        }
    return result


def _gate(problem: Problem, cand_source: str, device: str, seeds: int) -> dict:
    timers = guard.timer_identities()
    cand = _load_candidate(cand_source)
    _policy(guard.check_untouched, problem.module, problem.pristine, prefix="importing it: ")
    _check_signature(problem, cand)
    _policy(guard.check_timers, timers)
    worst_abs = worst_rel = 0.0
    tol = 0.0
    # one shape per input-dtype signature: a problem whose shapes change dtype (fp32, fp16, bf16) has every
    # dtype path gated, each at its smallest shape
    shapes = problem.gate_shapes(device)
    for shape in shapes:
        where = f"shape {shape_label(shape)}, " if len(shapes) > 1 else ""
        try:
            ref, new, weights = build_guarded(problem, cand, shape, device)
        except Exception as e:
            raise CandidateFault(
                "runtime", f"ModelNew(*get_init_inputs()) raised {type(e).__name__}: {e}"
            ) from e
        forbidden = _MEMO.get(
            problem.hash,
            ("forbidden", device, shape_label(shape)),
            lambda r=ref, s=shape: guard.forbidden_ops(record_calls(r, problem.inputs(s, 0, device))),
        )
        _policy(check_reference, problem, ref, weights, prefix=where)
        previous: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        for seed in range(seeds):
            # the memo's inputs stay as drawn: the candidate gets copies, and is checked against them
            draw = _reference_draw(problem, ref, shape, device, seed, weights)
            before, expected = draw.inputs, draw.truth
            inputs = [layout_copy(x) for x in before]
            with torch.no_grad():
                watch = guard.Watch(forbidden, problem.module.Model, device)
                try:
                    with watch:
                        got = outputs(new(*inputs))
                        if device == "cuda":
                            torch.cuda.synchronize()
                except CandidateFault:
                    raise
                except Exception as e:
                    raise CandidateFault(
                        "runtime", f"{where}seed {seed}: forward raised {type(e).__name__}: {e}"
                    ) from e
                _policy(watch.check, prefix=f"{where}seed {seed}: ")
                _policy(check_reference, problem, ref, weights, prefix=f"{where}seed {seed}: ")
                _policy(guard.check_timers, timers, prefix=f"{where}seed {seed}: ")
            for x, b in zip(inputs, before, strict=True):
                if isinstance(x, torch.Tensor) and not torch.equal(x, b):
                    raise CandidateFault("policy", f"{where}seed {seed}: the candidate mutated its inputs")
            _policy(guard.check_outputs, got, inputs, prefix=f"{where}seed {seed}: ")
            if len(got) != len(expected):
                raise CandidateFault("mismatch", f"{len(got)} outputs, the reference returns {len(expected)}")
            if previous is not None and _same(got, previous[0]) and not _same(expected, previous[1]):
                raise CandidateFault(
                    "policy",
                    f"{where}seed {seed}: fresh inputs gave the previous call's outputs "
                    "(results cached across calls)",
                )
            previous = ([g.detach().clone() for g in got], expected)
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
