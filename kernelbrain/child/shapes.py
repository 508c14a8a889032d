"""Shapes that fit: a problem's shape scaled down to a byte budget by halving its size constants, the
batch-like ones first, where the file declares no smaller shape of its own.

A size constant is a module-level int that `get_inputs` reads (or that a KB_SHAPES entry sets); for the
interpreter (`cpu`), one that `get_init_inputs` reads too. Each is classed by what halving it changes,
seen on the meta device (no memory is touched):

- `batch`: only the first dimension of the inputs, nothing `get_init_inputs` returns: rows, samples;
- `free`: other input dimensions (a row's length, an image's height), not the model's construction;
- `model`: what `get_init_inputs` returns (a layer's width): halved last, where nothing else is left.

Constants are halved one step at a time, the largest of the first class that still has one, until the
shape's inputs and outputs fit. Halving keeps a value's odd factor and its divisibility by smaller powers
of two, so a kernel whose blocks divide the declared size still divides the fitted one.

The interpreter's fit (`cpu`) counts the model's parameters and buffers too (Model built on the meta
device), and first halves the model's sizes while those take more than half the budget (an 8192 x 8192
Linear: its in and out features). It keeps what selects a template's strategy: a `model` constant is
halved only where that shrinks some weight's or input's dimensions and grows none (a stride, a padding, a
group or head count, a layer count, a pooling window stay: a template bakes them into its kernel, and one
rendered at the CPU's count would be wrong at the file's), never a convolution's window (its kernel
size); an odd size stays odd (a masked tail stays masked), a power of two stays one, and no size goes
below 1 or the floors below, so a dimension of 1 (a GEMV's column) or under 8 is never touched. What the
file derives from a size (`bias_shape = (out_channels, 1, 1)`) follows it (loading.Problem.use), a size
that holds a count whole (channels of groups) stays at twice the count at least, and two
sizes the reference refuses halved alone (a LayerNorm's width and the dimension it normalises) are tried
together.

Where the fit may run the reference (the run's analysis, a child no guard watches), each step's outputs
are the reference's own on the meta device, and a size the reference refuses there (a LayerNorm whose
width is the declared last dimension, a forward that asserts its input's size) is not taken. Elsewhere
the outputs are taken as large as the inputs; the analysis records its fits (`Fit`) and every later child
is handed them. A fit left over its budget says why in its note ("runs at the file's own size: ...").
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch

from kernelbrain.core.problem import shape_label

if TYPE_CHECKING:
    from kernelbrain.child.loading import Problem

Kind = Literal["batch", "free", "model"]
Shape = dict[str, Any]  # module constants' values by name

# one gate draw's inputs and outputs on a GPU: the gate rejects cheaply, and every rung still checks the
# candidate's outputs at the benchmark shapes themselves; further capped by the device's memory (the
# judge holds a draw's float64 truth beside the reference's and the candidate's outputs)
GATE_BYTES = 64 * 1024 * 1024
# the shape a CPU run checks and times through the Triton interpreter (tens of thousands of elements),
# its weights included
CPU_BYTES = 256 * 1024
# a first pass halves no constant below these, so a fitted shape keeps several rows and rows of some length
# (a GEMM's M and its tiles); a second pass, only where the first falls short, goes down to the last floors
GATE_ROWS = 16
CPU_ROWS = 2  # the interpreter's shape keeps a row's length before its count
FIRST: dict[str, int] = {"free": 64, "model": 64}
LAST: dict[str, int] = {"batch": 1, "free": 8, "model": 8}
ORDER: tuple[Kind, ...] = ("batch", "free", "model")
# modules whose weight's dimensions from the third on are a window (kernel size), never a size to halve
WINDOWED = (
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.ConvTranspose1d,
    torch.nn.ConvTranspose2d,
    torch.nn.ConvTranspose3d,
)


class Knob(NamedTuple):
    name: str
    kind: Kind


class Fitted(NamedTuple):
    sizes: Shape  # the shape, its halved constants set
    note: str  # why it stays over the budget ("" where it fits)


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


def half(value: int, cpu: bool = False) -> int:
    """value // 2; for the interpreter an odd value stays odd (a tail no block divides stays one)."""
    return value // 2 | 1 if cpu and value % 2 else value // 2


def _tensor_shapes(xs: list[Any]) -> list[tuple[int, ...]]:
    return [tuple(x.shape) for x in xs if isinstance(x, torch.Tensor)]


# a shape's outputs on the meta device, from the reference (raises what the problem raises at that shape)
Outputs = Callable[[Shape], list[torch.Tensor]]


def _bytes(xs: list[Any]) -> int:
    return sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))


class Weights(NamedTuple):
    nbytes: int  # the parameters' and buffers' bytes
    layout: dict[str, tuple[tuple[int, ...], int]]  # each one's shape and where its window dims start


def weights(problem: Problem, shape: Shape) -> Weights:
    """The model's parameters and buffers at a shape, Model built on the meta device (no memory). Raises
    what building it raises (an __init__ that needs the host)."""
    init = problem.init_inputs(shape)
    with torch.device("meta"):
        model = problem.module.Model(*init)
    layout: dict[str, tuple[tuple[int, ...], int]] = {}
    seen: dict[int, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        owned = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, t in owned:
            window = 2 if isinstance(module, WINDOWED) and name == "weight" else t.dim()
            layout[f"{prefix}.{name}"] = (tuple(t.shape), window)
            seen[id(t)] = t
    return Weights(_bytes(list(seen.values())), layout)


def footprint(
    problem: Problem, shape: Shape, outputs: Outputs | None = None, with_weights: bool = False
) -> int:
    """Bytes of a shape's inputs and outputs, and `with_weights` its parameters and buffers. Without
    `outputs` the reference is not run, not even on the meta device (some of its meta kernels import
    torch._dynamo, which replaces torch functions as it loads, in a child whose torch the guard has
    already recorded), and the outputs are taken as large as the inputs. Raises what the problem raises."""
    inputs = _bytes(problem.inputs(shape, 0, "meta"))
    size = inputs + (_bytes(outputs(shape)) if outputs is not None else inputs)
    return size + (weights(problem, shape).nbytes if with_weights else 0)


def _a_size(
    before: Weights, after: Weights, inputs: list[tuple[int, ...]], moved: list[tuple[int, ...]]
) -> bool:
    """Whether halving a model constant only shrank dimensions (of weights or inputs), none of them a
    window's: a width, not a stride, a group or layer count, a kernel size."""
    if before.layout.keys() != after.layout.keys() or len(inputs) != len(moved):
        return False
    pairs = [(*before.layout[k], after.layout[k][0]) for k in before.layout]
    pairs += [(a, len(a), b) for a, b in zip(inputs, moved, strict=True)]
    for a, window, b in pairs:
        if len(a) != len(b) or any(y > x for x, y in zip(a, b, strict=True)) or a[window:] != b[window:]:
            return False
    return any(a != b for a, _, b in pairs)


def _probe(problem: Problem, shape: Shape, cpu: bool) -> tuple[list[Knob], dict[str, str]]:
    """The shape's size constants, classed; and those the problem refuses halved, with why."""
    try:
        base_weights = weights(problem, shape) if cpu else None
    except Exception:
        base_weights = None  # its __init__ needs the host: get_init_inputs' own constants stay as declared
    read = _names(problem.module.get_inputs.__code__) | set(shape)
    if base_weights is not None:
        read |= _names(problem.module.get_init_inputs.__code__)
        for d in reversed(problem.derived):  # `bias_shape = (out_channels, 1, 1)`: out_channels is read
            if d.name in read:
                read |= d.reads
    values = {**problem.base_globals, **shape}
    base_inputs = _tensor_shapes(problem.inputs(shape, 0, "meta"))
    base_init = repr(problem.init_inputs(shape))
    found, refused = [], {}
    for name in sorted(read):
        if name.startswith("KB_") or not _is_size(values.get(name)):
            continue
        probe = {**shape, name: half(values[name], cpu)}
        try:
            init = repr(problem.init_inputs(probe))
            moved = _tensor_shapes(problem.inputs(probe, 0, "meta"))
            after = weights(problem, probe) if base_weights is not None and init != base_init else None
        except Exception as e:
            refused[name] = _why(e)  # a constant the problem cannot take halved stays as declared
            continue
        if init != base_init:
            if base_weights is None or after is None or _a_size(base_weights, after, base_inputs, moved):
                found.append(Knob(name, "model"))
        elif moved == base_inputs:
            continue  # read, but no input's shape depends on it (a scale, a seed)
        elif len(moved) == len(base_inputs) and all(
            len(a) == len(b) and a[1:] == b[1:] for a, b in zip(moved, base_inputs, strict=True)
        ):
            found.append(Knob(name, "batch"))
        else:
            found.append(Knob(name, "free"))
    return found, refused


def knobs(problem: Problem, shape: Shape, cpu: bool = False) -> list[Knob]:
    """The shape's size constants, classed by what halving one changes (for the interpreter, `cpu`,
    get_init_inputs' sizes too)."""
    return _probe(problem, shape, cpu)[0]


def _why(e: Exception) -> str:
    text = (str(e).strip().splitlines() or [""])[0][:120]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class _Fit:
    """One fit's state: the sizes so far, the constants left, each shape's bytes, what was refused."""

    def __init__(self, problem: Problem, shape: Shape, outputs: Outputs | None, cpu: bool) -> None:
        self.problem, self.outputs, self.cpu = problem, outputs, cpu
        self.values = {**problem.base_globals, **shape}
        self.fitted = dict(shape)
        self.found: list[Knob] = []
        self.refused: dict[str, str] = {}
        self.dropped: list[Knob] = []  # constants the reference refused halved alone
        self.checked = True  # whether each step's outputs come from the reference (where it may run)
        self._io: dict[str, int] = {}
        self._weights: dict[str, int] = {}  # by get_init_inputs' repr: the weights depend on nothing else
        self.counted = cpu  # whether the weights are counted: Model builds on the meta device
        if cpu:
            try:
                self.weights(shape)
            except Exception:
                self.counted = False

    def weights(self, shape: Shape) -> int:
        if not self.counted:
            return 0
        key = repr(self.problem.init_inputs(shape))
        if key not in self._weights:
            self._weights[key] = weights(self.problem, shape).nbytes
        return self._weights[key]

    def io(self, shape: Shape) -> int:
        key = shape_label(shape)
        if key not in self._io:
            self._io[key] = footprint(self.problem, shape, self.outputs)
        return self._io[key]

    def value(self, knob: Knob) -> int:
        """A constant's value so far (a pair's larger one)."""
        return max(int(self.fitted.get(n, self.values[n])) for n in knob.name.split("+"))

    def counts(self) -> dict[str, int]:
        """The problem's int constants over 1 that no halving touches (a group, head or layer count, a
        stride): those a size may be a multiple of."""
        sizes = {n for k in (*self.found, *self.dropped) for n in k.name.split("+")} | set(self.fitted)
        return {n: v for n, v in self.values.items() if _is_size(v) and n not in sizes and n.isidentifier()}

    def holds(self, name: str, count: int) -> bool:
        """Whether size `name` holds `count` whole (channels of groups): the problem refuses it one over."""
        try:
            self.check({**self.fitted, name: count + 1})
        except Exception:
            return True
        return False

    def halved(self, knob: Knob, floor: int) -> Shape | None:
        """The shape with this constant (or pair) halved; None where that goes below `floor`, or makes a
        model size that is a multiple of a count (channels of groups, a width of heads) under twice it: a
        group of one channel is a norm whose output is its bias, whatever the input, and a test of
        nothing."""
        out = dict(self.fitted)
        counts = self.counts() if knob.kind == "model" else {}
        for name in knob.name.split("+"):
            value = self.fitted.get(name, self.values[name])
            new = half(value, self.cpu)
            if value < 2 or new < floor:
                return None
            if any(value % c == 0 and new < 2 * c and self.holds(name, c) for c in counts.values()):
                return None
            out[name] = new
        return out

    def pair(self) -> bool:
        """Pairs of the constants the reference refused halved alone, to halve together (a LayerNorm's
        width and the last dimension it normalises); whether there are any."""
        for i, a in enumerate(self.dropped):
            for b in self.dropped[i + 1 :]:
                kind = max(a.kind, b.kind, key=ORDER.index)
                self.found.append(Knob(f"{a.name}+{b.name}", kind))
        self.dropped = []
        return any("+" in k.name for k in self.found)

    def halve(self, kinds: tuple[Kind, ...], floors: dict[str, int], over: Callable[[Shape], bool]) -> None:
        """Halve constants of `kinds`, the first kind's largest first, down to `floors`, while `over` the
        shape; where only the model's kind is halved, only a halving that shrinks the weights is taken."""
        left = [k for k in self.found if k.kind in kinds]
        while left and over(self.fitted):
            kind = next(k for k in ORDER if any(n.kind == k for n in left))
            knob = max((n for n in left if n.kind == kind), key=self.value)
            trial = self.halved(knob, floors[knob.kind])
            if trial is None:
                left.remove(knob)
                continue
            try:
                self.check(trial)  # raises what the problem (or, where checked, the reference) raises
                useless = kinds == ("model",) and self.weights(trial) >= self.weights(self.fitted)
            except Exception as e:
                self.refused.setdefault(knob.name, _why(e))
                self.found.remove(knob)  # the problem refuses this size: the constant stays where it was
                self.dropped.append(knob)
                left.remove(knob)
                continue
            if useless:
                left.remove(knob)
                continue
            self.fitted = trial

    def check(self, shape: Shape) -> None:
        if self.checked:
            self.io(shape)
        else:  # get_inputs and Model's __init__ only
            self.problem.inputs(shape, 0, "meta")
            self.weights(shape)

    def halve_weights(self, floors: dict[str, int], half_budget: int) -> None:
        """The model's sizes halved while its weights take more than half the budget. Each step is checked
        on the inputs and weights alone, the reference once at the end (where it runs the meta device
        slowly, an LSTM over 512 steps, that is seconds a step saved); where it refuses that, again with
        each step checked."""
        before = (dict(self.fitted), list(self.found), dict(self.refused), list(self.dropped))
        self.checked = False
        try:
            self.halve(("model",), floors, lambda s: self.weights(s) > half_budget)
        finally:
            self.checked = True
        try:
            self.io(self.fitted)
            return
        except Exception:
            self.fitted, self.found, self.refused, self.dropped = before
        self.halve(("model",), floors, lambda s: self.weights(s) > half_budget)


def fitted(
    problem: Problem, shape: Shape, budget: int, rows: int, outputs: Outputs | None = None, cpu: bool = False
) -> Fitted:
    """`shape` with size constants halved until it fits in `budget` bytes (inputs and outputs; for the
    interpreter, `cpu`, the weights too), batch-like ones first and none below `rows` rows or FIRST while
    that is enough; the shape itself where it fits. Only sizes change. With `outputs`, a halving the
    reference refuses is not taken; a reference that does not run on the meta device at `shape` itself
    is not asked again. The note says why a fit stays over the budget."""
    if outputs is not None:
        try:
            outputs(shape)
        except Exception:
            outputs = None  # it needs real values or the host: the outputs are estimated
    fit = _Fit(problem, shape, outputs, cpu)
    if fit.io(shape) + fit.weights(shape) <= budget:
        return Fitted(shape, "")
    fit.found, fit.refused = _probe(problem, shape, fit.counted)
    for _ in range(2 if cpu else 1):  # for the interpreter, again with refused constants paired
        for floors in ({**FIRST, "batch": rows}, LAST):
            if fit.counted:  # the model's sizes first, while its weights take more than half the budget
                fit.halve_weights(floors, budget // 2)
            # weights past half the budget are not the inputs' to make room for
            fit.halve(ORDER, floors, lambda s: fit.io(s) + min(fit.weights(s), budget // 2) > budget)
        size = fit.io(fit.fitted) + fit.weights(fit.fitted)
        if size <= budget or not fit.pair():
            break
    if cpu:  # its label lists the sizes as the file defines them, not in the order they were halved
        order = list(vars(problem.module))
        fit.fitted = dict(
            sorted(fit.fitted.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else -1)
        )
    return Fitted(fit.fitted, "" if size <= budget else _note(fit, shape, size, budget))


def _note(fit: _Fit, shape: Shape, size: int, budget: int) -> str:
    where = (
        "runs at the file's own size"
        if fit.fitted == shape
        else f"runs at {shape_label(fit.fitted)}, {size // 1024} KiB, over the {budget // 1024} KiB budget"
    )
    # a constant halved after all (with another) is not one the problem refuses
    refused = {
        n: why for n, why in fit.refused.items() if fit.fitted.get(n, fit.values.get(n)) == fit.values.get(n)
    }
    if refused:
        named = "; ".join(f"{name} ({why})" for name, why in sorted(refused.items())[:3])
        return f"{where}: the problem refuses a smaller {named}"
    if not fit.found:
        return f"{where}: get_inputs and get_init_inputs read no size constant kb can halve"
    return f"{where}: its other sizes are literals or at kb's floors"


def fit(
    problem: Problem, shape: Shape, budget: int, rows: int, outputs: Outputs | None = None, cpu: bool = False
) -> Shape:
    """fitted()'s sizes."""
    return fitted(problem, shape, budget, rows, outputs, cpu).sizes
