"""Loading inside the sandboxed child: a problem file with its extras, a candidate's module, models built
the same way for reference and candidate, inputs drawn at a shape and seed."""

from __future__ import annotations

import ast
import contextlib
import copy
import hashlib
import importlib.util
import inspect
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any, NamedTuple

import torch

from kernelbrain.child import guard, shapes
from kernelbrain.core.accuracy import Accuracy
from kernelbrain.core.events import GateCategory
from kernelbrain.core.problem import DEFAULT_TOLERANCE, shape_label
from kernelbrain.core.protocol import Fit

_MODULES: dict[str, ModuleType] = {}
_PRISTINE: dict[str, dict[str, Any]] = {}
_BASE: dict[str, dict[str, Any]] = {}
_DERIVED: dict[str, list[Derived]] = {}
FitKey = tuple[str, int, int]  # a base shape's label, the byte budget, the row floor
_GIVEN: dict[str, dict[FitKey, Fit]] = {}  # per problem (its source's hash): the analysis's fits
_ACCURACY: dict[str, Accuracy] = {}  # per problem (its source's hash): the regime the analysis measured


def give_fits(problem_source: str, fits: list[Fit]) -> None:
    """The fits the run's analysis made for this problem (where the reference could run), used by every
    Problem of this source in this child instead of fitting again without the reference."""
    digest = hashlib.sha256(problem_source.encode()).hexdigest()
    _GIVEN[digest] = {(f.shape, f.budget, f.rows): f for f in fits}


def give_accuracy(problem_source: str, accuracy: Accuracy | None) -> None:
    """The accuracy regime the run's analysis measured at the primary shape (core/accuracy.py), for every
    Problem of this source in this child: the judge runs the reference in it at the gate's shapes."""
    digest = hashlib.sha256(problem_source.encode()).hexdigest()
    if accuracy is None:
        _ACCURACY.pop(digest, None)
    else:
        _ACCURACY[digest] = accuracy


class Derived(NamedTuple):
    name: str
    code: CodeType  # the expression the file assigns it
    reads: frozenset[str]  # the module globals that expression reads


# what a derived constant's expression may hold: names, numbers and arithmetic on them, tuples, lists
_PURE = (ast.Expression, ast.Tuple, ast.List, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load)
_PURE_OPS = (ast.operator, ast.unaryop)


def derived_constants(source: str) -> list[Derived]:
    """The module-level constants the file computes from others (`bias_shape = (out_channels, 1, 1)`),
    in source order: a shape that sets `out_channels` sets them too, as the file would."""
    out = []
    for node in ast.parse(source).body:
        if not (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            continue
        expr = ast.Expression(node.value)
        reads = frozenset(n.id for n in ast.walk(expr) if isinstance(n, ast.Name))
        if reads and all(isinstance(n, _PURE + _PURE_OPS) for n in ast.walk(expr)):
            out.append(Derived(node.targets[0].id, compile(expr, "<derived>", "eval"), reads))
    return out


class CandidateFault(Exception):
    """A candidate failed a check; `category` is one of GateFailed's categories."""

    def __init__(
        self,
        category: GateCategory,
        detail: str,
        *,
        max_abs_err: float | None = None,
        max_rel_err: float | None = None,
    ) -> None:
        super().__init__(detail)
        self.category = category
        self.detail = detail
        self.max_abs_err = max_abs_err  # a mismatch's error figures, for the gate's verdict
        self.max_rel_err = max_rel_err


def load_module(source: str, prefix: str) -> ModuleType:
    """Import source from a real file: Triton's @jit reads a kernel's source through inspect."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"kb_{prefix}_{digest}"
    if name in _MODULES:
        return _MODULES[name]
    path = Path(tempfile.gettempdir()) / f"{name}.py"
    # written under a private name, then renamed into place: another process loading the same source
    # at the same moment (test workers share /tmp) reads the whole file, never a half-written one
    fd, part = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source)
        os.replace(part, path)
    except BaseException:
        Path(part).unlink(missing_ok=True)
        raise
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _MODULES[name] = module
    return module


class Problem:
    """A loaded KernelBench problem with kb's optional extras resolved."""

    def __init__(self, source: str) -> None:
        self.module = load_module(source, "problem")
        # what the module defines as first loaded, before any candidate code could replace it
        self.pristine = _PRISTINE.setdefault(self.module.__name__, guard.problem_identities(self.module))
        self.hash = hashlib.sha256(source.encode()).hexdigest()
        m = self.module
        # the globals as first loaded: use() sets a shape's onto the module, which later Problems share
        self.base_globals = _BASE.setdefault(
            m.__name__, {k: getattr(m, k) for k in dir(m) if not k.startswith("__")}
        )
        self.derived = _DERIVED.setdefault(m.__name__, derived_constants(source))
        declared = getattr(m, "KB_SHAPES", None) or [{}]
        self.shapes: list[dict] = [dict(s) for s in declared]
        smoke = getattr(m, "KB_SMOKE_SHAPE", None)
        self.smoke: dict | None = dict(smoke) if smoke else None
        # shapes the GPU gate checks instead of the smallest of each dtype: a problem whose every
        # shape is huge (a float64 reference of 500M outputs, three seeds) names cheaper ones here
        self.gate: list[dict] | None = [dict(s) for s in getattr(m, "KB_GATE_SHAPES", None) or []] or None
        self.tolerance = {**DEFAULT_TOLERANCE, **(getattr(m, "KB_TOLERANCE", None) or {})}
        # the mode the reference runs in: the one Model(*get_init_inputs()) is left in (training, for a
        # KernelBench file, as its harness runs it), or eval where the problem says KB_EVAL = True
        # (`kb run --eval` adds that line to the problem it records)
        self.eval_mode = bool(getattr(m, "KB_EVAL", False))
        # IEEE float32 contractions whatever the reference does (`kb run --strict-fp32` adds the line)
        self.strict_fp32 = bool(getattr(m, "KB_STRICT_FP32", False))
        self._fits: dict[FitKey, shapes.Fitted] = {}
        # where the reference may run (a child no guard watches: the analysis), each fit step is checked
        # against the reference's outputs on the meta device
        self.fit_outputs: shapes.Outputs | None = None

    @property
    def accuracy(self) -> Accuracy | None:
        """The regime the run's analysis measured (None: none given; the reference runs as it does)."""
        return _ACCURACY.get(self.hash)

    def tolerance_of(self, dtype: torch.dtype) -> float:
        return self.tolerance.get(str(dtype).removeprefix("torch."), 1e-4)

    def use(self, shape: dict[str, Any]) -> None:
        for k, v in self.base_globals.items():
            setattr(self.module, k, v)
        for k, v in shape.items():
            setattr(self.module, k, v)
        changed = set(shape)
        for d in self.derived:  # what the file computes from the shape's sizes follows them
            if d.name not in shape and d.reads & changed:
                setattr(self.module, d.name, eval(d.code, vars(self.module)))
                changed.add(d.name)

    def inputs(self, shape: dict, seed: int, device: str = "cpu") -> list:
        """get_inputs() at a shape, drawn on the device itself: a GPU-sized tensor is never built on
        the host first. Tensors the problem puts on another device explicitly are moved."""
        self.use(shape)
        torch.manual_seed(seed)
        # on meta, torch's arithmetic may import torch._dynamo (kb's own doing: guard.own_imports)
        with torch.device(device), guard.own_imports() if device == "meta" else contextlib.nullcontext():
            return [to_device(x, device) for x in self.module.get_inputs()]

    def init_inputs(self, shape: dict) -> list:
        self.use(shape)
        return list(self.module.get_init_inputs())

    def ladder_shapes(self, device: str, which: str) -> list[dict]:
        """The shapes a rung measures: on CPU the smoke shape, else the smallest fitted to
        shapes.CPU_BYTES; on a GPU smallest/primary/all as declared."""
        if device == "cpu":
            if self.smoke is not None:
                return [self.smoke]
            return [self._fitted(self.smallest(), shapes.CPU_BYTES, shapes.CPU_ROWS, cpu=True)]
        if which == "primary":
            return [self.shapes[0]]
        if which == "smallest":
            return [self.smallest()]
        return self.shapes

    def gate_shapes(self, device: str) -> list[dict]:
        """The shapes the gate checks: the CPU shape, or on GPU the problem's KB_GATE_SHAPES, else the
        smallest of each input-dtype group fitted to the gate's byte budget."""
        if device == "cpu":
            return self.ladder_shapes("cpu", "smallest")
        if self.gate is not None:
            return self.gate
        groups: dict[tuple, list[dict]] = {}
        for s in self.shapes:
            key = tuple(str(x.dtype) for x in self.inputs(s, 0, "meta") if isinstance(x, torch.Tensor))
            groups.setdefault(key, []).append(s)
        budget = shapes.gate_budget(device)
        return [self._fitted(min(g, key=self._size), budget, shapes.GATE_ROWS) for g in groups.values()]

    def _fitted(self, shape: dict[str, Any], budget: int, rows: int, cpu: bool = False) -> dict[str, Any]:
        """`shape` fitted to the budget (shapes.fitted; `cpu`: the interpreter's, weights counted), or as
        the analysis fitted it where it handed its fits over."""
        key = (shape_label(shape), budget, rows)
        if key not in self._fits:
            given = _GIVEN.get(self.hash, {}).get(key)
            if given is not None:
                self._fits[key] = shapes.Fitted({**shape, **given.sizes}, given.note)
            else:
                self._fits[key] = shapes.fitted(self, shape, budget, rows, self.fit_outputs, cpu)
        return self._fits[key].sizes

    def fits(self) -> list[Fit]:
        """The fits made (or given) in this Problem so far: the sizes each changed, and why one stays
        over its budget."""
        values = {**self.base_globals}
        out = []
        for (label, budget, rows), (fitted, note) in self._fits.items():
            sizes = {k: v for k, v in fitted.items() if type(v) is int and v != values.get(k)}
            out.append(Fit(shape=label, budget=budget, rows=rows, sizes=sizes, note=note))
        return out

    def meta_outputs(self, shape: dict) -> list[torch.Tensor]:
        """The reference's outputs at a shape on the meta device: shapes and dtypes, no memory. Only where
        no guard watches torch (some meta kernels import torch._dynamo, which replaces torch functions)."""
        init = self.init_inputs(shape)
        torch.manual_seed(1234)
        with torch.device("meta"):
            ref = in_mode(self.module.Model(*init), self.eval_mode)
        with torch.no_grad(), guard.own_imports():  # a meta kernel may import torch._dynamo
            return outputs(ref(*self.inputs(shape, 0, "meta")))

    def _size(self, shape: dict) -> int:
        return sum(numel(x) for x in self.inputs(shape, 0, "meta"))

    def smallest(self) -> dict:
        # sized on the meta device: no memory is touched to compare shapes
        return min(self.shapes, key=self._size)


def numel(x: Any) -> int:
    return x.numel() if isinstance(x, torch.Tensor) else 0


def to_device(x: Any, device: str, dtype: torch.dtype | None = None) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.to(device)
        return x.to(dtype) if dtype is not None and x.is_floating_point() else x
    return x


def signature(fn: Callable) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in list(inspect.signature(fn).parameters.values())[1:]]


def in_mode(model: torch.nn.Module, eval_mode: bool) -> torch.nn.Module:
    """The model in eval mode where asked, else in the mode its constructor left it (training, unless
    it chose otherwise): the reference is the user's module as constructed."""
    return model.eval() if eval_mode else model


def construct(cls: type, init: list, device: str, *, eval_mode: bool) -> torch.nn.Module:
    """cls(*init) built on the device, so a large layer's weights are drawn there rather than on one
    host core and copied; an __init__ that needs the host (numpy, a CPU generator) is built there and
    moved. Seeded either way; in the problem's mode (`in_mode`)."""
    torch.manual_seed(1234)
    if device != "cpu":
        try:
            with torch.device(device):
                return in_mode(cls(*init).to(device), eval_mode)
        except Exception:
            torch.manual_seed(1234)
    return in_mode(cls(*init).to(device), eval_mode)


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def fingerprint(t: torch.Tensor) -> tuple:
    """A tensor's shape, dtype and the wrapping sum of its bits: two tensors with equal fingerprints
    are equal but for a collision, NaNs included (their bits are summed, not their values)."""
    as_int = _SAME_SIZE_INT.get(t.element_size())
    bits = t.view(as_int) if as_int is not None else t.contiguous().view(torch.uint8)
    return tuple(t.shape), str(t.dtype), int(bits.sum(dtype=torch.int64)) if t.numel() else 0


def draw_digest(inputs: list) -> str:
    """One string for the fingerprints of a draw's tensors: what the judge drew, checked where it is
    read back or kept."""
    prints = [fingerprint(x) for x in inputs if isinstance(x, torch.Tensor)]
    return hashlib.sha256(repr(prints).encode()).hexdigest()


def layout_copy(x: Any) -> Any:
    """A copy of a tensor with its own layout (offset, strides, overlap): a clone would be contiguous,
    and a candidate that ignores strides would pass on it."""
    if not isinstance(x, torch.Tensor):
        return copy.deepcopy(x)
    out = torch.empty(0, dtype=x.dtype, device=x.device)
    return out.set_(x.untyped_storage().clone(), x.storage_offset(), x.size(), x.stride())


def running_state(model: torch.nn.Module, compared: bool = False) -> set[str]:
    """The state_dict keys its own forward rewrites: the running statistics and batch counters of torch's
    norms in training mode. Their training-mode outputs never read them (a norm normalises by the
    batch's statistics), so a candidate that changes them changes no reference output; the gate compares
    them with the candidate's own after each call instead (`compared`: those it compares; a batch counter
    only where it weighs the running average, momentum None, as it decides nothing else)."""
    keys = set()
    for name, sub in model.named_modules():
        if isinstance(sub, torch.nn.modules.batchnorm._NormBase) and sub.training:
            prefix = f"{name}." if name else ""
            for b, v in sub.named_buffers(recurse=False):
                counter = b == "num_batches_tracked" and sub.momentum is not None
                if v is not None and not (compared and counter):
                    keys.add(f"{prefix}{b}")
    return keys


@contextlib.contextmanager
def running_state_kept(model: torch.nn.Module) -> Iterator[list[str]]:
    """The model's running state (`running_state`'s keys) as it was before the body, put back after it:
    calls made to find something out do not move the state the next call starts from. Yields the keys
    the gate compares, sorted."""
    keys = sorted(running_state(model))
    state = model.state_dict()
    before = {k: state[k].clone() for k in keys}
    try:
        yield sorted(running_state(model, compared=True))
    finally:
        with torch.no_grad():
            for k in keys:
                state[k].copy_(before[k])


def weight_prints(model: torch.nn.Module) -> tuple:
    """The fingerprints of the model's weights and buffers, but for its running state (`running_state`)."""
    skip = running_state(model)
    return tuple(fingerprint(t) for k, t in model.state_dict().items() if k not in skip)


def build_guarded(
    problem: Problem, cand: ModuleType | None, shape: dict, device: str
) -> tuple[torch.nn.Module, torch.nn.Module | None, tuple]:
    """The reference and the candidate built alike, the candidate given the reference's weights as they
    were before any candidate code ran, and their fingerprints then (a candidate's __init__ may reach
    the reference through gc)."""
    init = problem.init_inputs(shape)
    ref = construct(problem.module.Model, init, device, eval_mode=problem.eval_mode)
    if cand is None:  # no candidate code runs: nothing to guard (and meta tensors have no bits)
        return ref, None, ()
    prints = weight_prints(ref)
    pristine = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    # in the reference's mode: a Model whose constructor chose eval is matched in eval
    new = construct(cand.ModelNew, init, device, eval_mode=problem.eval_mode or not ref.training)
    new_state = new.state_dict()
    if pristine.keys() == new_state.keys() and all(pristine[k].shape == new_state[k].shape for k in pristine):
        new.load_state_dict(pristine)
    return ref, new, prints


def problems_tampered() -> bool:
    """Whether a problem module loaded in this process no longer holds what it held when first loaded."""
    return any(
        guard.moved(pristine, guard.problem_identities(_MODULES[name]))
        for name, pristine in _PRISTINE.items()
        if name in _MODULES
    )


def check_reference(problem: Problem, ref: torch.nn.Module, weights: tuple) -> None:
    """The reference as it was before any candidate code ran: its weights, its class and module, torch.
    Raises guard.Violation naming what changed."""
    guard.check_untouched(problem.module, problem.pristine)
    if weight_prints(ref) != weights:
        raise guard.Violation("the candidate changed the reference model's weights")


def build(problem: Problem, cand: ModuleType | None, shape: dict, device: str):
    ref, new, _ = build_guarded(problem, cand, shape, device)
    return ref, new


def outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [o for o in out if isinstance(o, torch.Tensor)]
    raise CandidateFault("mismatch", f"forward returned {type(out).__name__}, not a tensor")
