"""Shapes that fit: a problem's shape scaled down to a byte budget by halving its size constants, the
batch-like ones first, where the file declares no smaller shape of its own.

A size constant is a module-level int that `get_inputs` reads (or that a KB_SHAPES entry sets). Each is
classed by what halving it changes, seen on the meta device (no memory is touched):

- `batch`: only the first dimension of the inputs, nothing `get_init_inputs` returns: rows, samples;
- `free`: other input dimensions (a row's length, an image's height), not the model's construction;
- `model`: what `get_init_inputs` returns (a layer's width): halved last, where nothing else is left.

Constants are halved one step at a time, the largest of the first class that still has one, until the
shape's inputs and outputs fit. Halving keeps a value's odd factor and its divisibility by smaller powers
of two, so a kernel whose blocks divide the declared size still divides the fitted one.

Where the fit may run the reference (the run's analysis, a child no guard watches), each step's outputs
are the reference's own on the meta device, and a size the reference refuses there (a LayerNorm whose
width is the declared last dimension) is not taken. Elsewhere the outputs are taken as large as the
inputs; the analysis records its fits (`Fit`) and every later child is handed them.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, NamedTuple

import torch

if TYPE_CHECKING:
    from kernelbrain.child.loading import Problem

# one gate draw's inputs and outputs on a GPU: the gate rejects cheaply, and every rung still checks the
# candidate's outputs at the benchmark shapes themselves; further capped by the device's memory (the
# judge holds a draw's float64 truth beside the reference's and the candidate's outputs)
GATE_BYTES = 64 * 1024 * 1024
# the shape a CPU run checks and times through the Triton interpreter (tens of thousands of elements)
CPU_BYTES = 256 * 1024
# a first pass halves no constant below these, so a fitted shape keeps several rows and rows of some length
# (a GEMM's M and its tiles); a second pass, only where the first falls short, goes down to the last floors
GATE_ROWS = 16
CPU_ROWS = 2  # the interpreter's shape keeps a row's length before its count
FIRST = {"free": 64, "model": 64}
LAST = {"batch": 1, "free": 8, "model": 8}
ORDER = ("batch", "free", "model")

Kind = Literal["batch", "free", "model"]


class Knob(NamedTuple):
    name: str
    kind: Kind


def gate_budget(device: str) -> int:
    """The gate's byte budget on this device: GATE_BYTES, or less where the device's memory is small."""
    if device == "cuda" and torch.cuda.is_available():
        # the judge's peak is a small multiple of a draw (float64 truth and copies, three seeds' worth of
        # outputs at the reader): a 64th of the card leaves the rest to the reference's own temporaries
        return min(GATE_BYTES, torch.cuda.get_device_properties(0).total_memory // 64)
    return GATE_BYTES


def _names(code: types.CodeType) -> set[str]:
    """The global names a function's code (and the code nested in it) reads."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 1


def _tensor_shapes(xs: list) -> list[tuple[int, ...]]:
    return [tuple(x.shape) for x in xs if isinstance(x, torch.Tensor)]


# a shape's outputs on the meta device, from the reference (raises what the problem raises at that shape)
Outputs = Callable[[dict], list[torch.Tensor]]


def _bytes(xs: list) -> int:
    return sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))


def footprint(problem: Problem, shape: dict, outputs: Outputs | None = None) -> int:
    """Bytes of a shape's inputs and outputs. Without `outputs` the reference is not run, not even on the
    meta device (some of its meta kernels import torch._dynamo, which replaces torch functions as it
    loads, in a child whose torch the guard has already recorded), and the outputs are taken as large as
    the inputs. Raises what the problem raises."""
    inputs = _bytes(problem.inputs(shape, 0, "meta"))
    return inputs + (_bytes(outputs(shape)) if outputs is not None else inputs)


def knobs(problem: Problem, shape: dict) -> list[Knob]:
    """The shape's size constants, classed by what halving one changes."""
    read = _names(problem.module.get_inputs.__code__) | set(shape)
    values = {**problem.base_globals, **shape}
    base_inputs = _tensor_shapes(problem.inputs(shape, 0, "meta"))
    base_init = repr(problem.init_inputs(shape))
    found = []
    for name in sorted(read):
        if name.startswith("KB_") or not _is_size(values.get(name)):
            continue
        probe = {**shape, name: values[name] // 2}
        try:
            init = repr(problem.init_inputs(probe))
            moved = _tensor_shapes(problem.inputs(probe, 0, "meta"))
        except Exception:
            continue  # a constant the problem cannot take halved stays as declared
        if init != base_init:
            found.append(Knob(name, "model"))
        elif moved == base_inputs:
            continue  # read, but no input's shape depends on it (a scale, a seed)
        elif len(moved) == len(base_inputs) and all(
            len(a) == len(b) and a[1:] == b[1:] for a, b in zip(moved, base_inputs, strict=True)
        ):
            found.append(Knob(name, "batch"))
        else:
            found.append(Knob(name, "free"))
    return found


def fit(problem: Problem, shape: dict, budget: int, rows: int, outputs: Outputs | None = None) -> dict:
    """`shape` with size constants halved until its inputs and outputs fit in `budget` bytes, batch-like
    ones first and none below `rows` rows or FIRST while that is enough; the shape itself where it fits.
    Only sizes change. With `outputs`, a halving the reference refuses is not taken; a reference that
    does not run on the meta device at `shape` itself is not asked again."""
    if outputs is not None:
        try:
            outputs(shape)
        except Exception:
            outputs = None  # it needs real values or the host: the outputs are estimated
    size = footprint(problem, shape, outputs)
    if size <= budget:
        return shape
    values = {**problem.base_globals, **shape}
    fitted = dict(shape)
    found = knobs(problem, shape)
    for floors in ({**FIRST, "batch": rows}, LAST):
        left = list(found)
        while left and size > budget:
            kind = next(k for k in ORDER if any(n.kind == k for n in left))
            knob = max((n for n in left if n.kind == kind), key=lambda n: fitted.get(n.name, values[n.name]))
            value = fitted.get(knob.name, values[knob.name])
            if value // 2 < floors[knob.kind]:
                left.remove(knob)
                continue
            trial = {**fitted, knob.name: value // 2}
            try:
                size = footprint(problem, trial, outputs)
            except Exception:
                found.remove(knob)  # the problem refuses this size: the constant stays where it was
                left.remove(knob)
                continue
            fitted = trial
    return fitted
