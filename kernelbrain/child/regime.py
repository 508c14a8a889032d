"""The accuracy contract's measurements (kernelbrain/core/accuracy.py states the contract): which format
the user's reference computes its float32 contractions in at the primary shape, and the reference run in
that regime at any other shape, for the gate's bound.

A contraction is measured alone, on random operands of the shapes the reference gives it at the primary
shape, run on the device as the user's flags have it (the problem file's own settings are in force: it
was imported in this process). Its truth is computed in float64 on a slice of its outputs: a batch
element of a convolution (a few output channels of it where one element is large), a few rows of a
matrix product, one matrix of a batched one. Beside it, the same slice with the product's two factors
rounded to TF32 and to bfloat16 (summed exactly, in float64): the error each format alone makes.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from kernelbrain.child import guard
from kernelbrain.child.loading import Problem, build
from kernelbrain.core.accuracy import KINDS, Accuracy, Format, Kind, Measured

Args = tuple[Any, ...]
Kwargs = dict[str, Any]
Call = tuple[Any, Args, Kwargs]  # an ATen op and its arguments, tensors as Spec

aten = torch.ops.aten
# the float32 contractions whose format the backend flags choose, and which of their operands are the
# product's factors (a bias added to it is not rounded)
KIND: dict[Any, Kind] = {
    aten.convolution.default: "conv",
    aten.mm.default: "matmul",
    aten.addmm.default: "matmul",
    aten.bmm.default: "matmul",
    aten.baddbmm.default: "matmul",
}
FACTORS: dict[Any, tuple[int, int]] = {
    aten.convolution.default: (0, 1),
    aten.mm.default: (0, 1),
    aten.addmm.default: (1, 2),
    aten.bmm.default: (0, 1),
    aten.baddbmm.default: (1, 2),
}
# mantissa bits a format drops from float32's 23: TF32 keeps 10, bfloat16 7
DROPPED: dict[Format, int] = {"tf32": 13, "bf16": 16}
# a contraction's error is IEEE float32's below this share of the error rounding to TF32 makes (IEEE errs
# thousands of times less); above, the format whose conversion (to nearest or truncated) errs nearest it
EXPLAINS = 0.25
SAMPLED = 1 << 16  # output elements computed in float64, about, per contraction measured
MEASURED = 8  # distinct contractions measured at most (a model's repeated layers are one)


def rounded(x: torch.Tensor, fmt: Format, nearest: bool = True) -> torch.Tensor:
    """A float32 tensor converted to the format's mantissa: to nearest (ties away from zero, PTX's
    cvt.rna), or by truncation (`nearest` False: what a tensor core fed float32 does); unchanged for
    IEEE, for other dtypes and where not finite."""
    if fmt == "ieee" or x.dtype != torch.float32:
        return x
    drop = DROPPED[fmt]
    bits = x.contiguous().view(torch.int32).clone()  # one copy: the operands may be most of the device
    if nearest:
        bits.add_(1 << (drop - 1))
    bits.bitwise_and_(~((1 << drop) - 1))
    near = bits.view(torch.float32).view(x.shape)
    return torch.where(torch.isfinite(x), near, x, out=near)  # in place: no second copy


def _precision_flags() -> list[tuple[Any, str, Any]]:
    """(object, attribute, value) of every flag that lets a float32 contraction round: torch's newer
    fp32_precision settings where it has them, else the allow_tf32 ones."""
    b = torch.backends
    conv = getattr(b.cudnn, "conv", None)  # torch's newer settings, where it has them
    if conv is not None and hasattr(b.cuda.matmul, "fp32_precision"):
        return [(b.cuda.matmul, "fp32_precision", "ieee"), (conv, "fp32_precision", "ieee")]
    return [(b.cuda.matmul, "allow_tf32", False), (b.cudnn, "allow_tf32", False)]


@contextlib.contextmanager
def ieee_contractions() -> Iterator[None]:
    """Float32 contractions in IEEE float32 for the block, whatever the flags were; restored after."""
    flags = _precision_flags()
    saved = [getattr(o, a) for o, a, _ in flags]
    try:
        for o, a, v in flags:
            setattr(o, a, v)
        yield
    finally:
        for (o, a, _), was in zip(flags, saved, strict=True):
            setattr(o, a, was)


@guard.dynamo_free
class InRegime(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Float32 contractions as the regime computes them: the factors truncated to its format (the coarser
    of hardware's two conversions, core/accuracy.py), the products summed in IEEE float32 (a TF32 tensor
    core's arithmetic); everything else as it runs."""

    def __init__(self, accuracy: Accuracy) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.formats = {k: accuracy.format_of(k) for k in KINDS}

    def __torch_dispatch__(self, func: Any, types: Any, args: Args = (), kwargs: Kwargs | None = None) -> Any:
        kind = KIND.get(func)
        if kind is not None and self.formats[kind] != "ieee":
            fmt, listed = self.formats[kind], list(args)
            for i in FACTORS[func]:
                if isinstance(listed[i], torch.Tensor):
                    listed[i] = rounded(listed[i], fmt, nearest=False)
            args = tuple(listed)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def in_regime(accuracy: Accuracy | None) -> Iterator[None]:
    """The reference's own run at a gate shape, in the regime measured at the primary shape (nothing
    changed where none was measured: an older run, `kb check` without an analysis)."""
    if accuracy is None:
        yield
        return
    loose = any(accuracy.format_of(k) != "ieee" for k in KINDS)
    with ieee_contractions(), InRegime(accuracy) if loose else contextlib.nullcontext():
        yield


class Spec:
    """A tensor argument of a recorded contraction: its shape and dtype only."""

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype = tuple(t.shape), t.dtype

    def __repr__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


@guard.dynamo_free
class _Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls: dict[str, Call] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Args = (), kwargs: Kwargs | None = None) -> Any:
        kwargs = kwargs or {}
        if func in KIND and all(
            isinstance(args[i], torch.Tensor) and args[i].dtype == torch.float32 for i in FACTORS[func]
        ):
            spec = tree_map(lambda a: Spec(a) if isinstance(a, torch.Tensor) else a, (args, kwargs))
            self.calls.setdefault(f"{func}{spec!r}", (func, *spec))
        return func(*args, **kwargs)


def contractions(problem: Problem, shape: dict[str, Any]) -> list[Call]:
    """The reference's distinct float32 contractions at a shape, traced on the meta device."""
    ref, _ = build(problem, None, shape, "meta")
    inputs = problem.inputs(shape, 0, "meta")
    recorder = _Recorder()
    with torch.no_grad(), guard.own_imports(), recorder:
        ref(*inputs)
    return list(recorder.calls.values())


def sample(func: Any, args: list[Any]) -> tuple[list[Any], tuple[slice, ...]]:
    """The arguments for a slice of the contraction's output, and that slice's index into it."""
    a = list(args)
    if func is aten.convolution.default:
        x, w = a[0], a[1]
        a[0] = x[:1]
        per_channel = math.prod(x.shape[2:]) or 1  # about: the output's spatial size is near the input's
        transposed, groups = bool(a[6]), int(a[8])
        channels = w.shape[1] if transposed else w.shape[0]
        keep = max(1, min(channels, SAMPLED // per_channel))
        if groups == 1 and keep < channels:
            a[1] = w[:, :keep] if transposed else w[:keep]
            a[2] = a[2][:keep] if isinstance(a[2], torch.Tensor) else a[2]
            return a, (slice(0, 1), slice(0, keep))
        return a, (slice(0, 1),)
    first = FACTORS[func][0]
    if func in (aten.bmm.default, aten.baddbmm.default):
        a = [t[:1] if isinstance(t, torch.Tensor) and t.dim() == 3 and t.shape[0] > 1 else t for t in a]
        rows = max(1, SAMPLED // max(1, a[first + 1].shape[-1]))
        a[first] = a[first][:, :rows]
        if func is aten.baddbmm.default and a[0].dim() == 3 and a[0].shape[1] > 1:
            a[0] = a[0][:, :rows]
        return a, (slice(0, 1), slice(0, rows))
    rows = max(1, SAMPLED // max(1, a[first + 1].shape[-1]))
    if func is aten.addmm.default and a[0].dim() == 2 and a[0].shape[0] > 1:
        a[0] = a[0][:rows]
    a[first] = a[first][:rows]
    return a, (slice(0, rows),)


def _error(got: torch.Tensor, truth: torch.Tensor) -> float:
    """Normwise relative error, scale-free: ||got - truth|| / ||truth||."""
    den = float(truth.norm())
    return float((got.to(torch.float64) - truth).norm()) / den if den > 0 else 0.0


def _wide(args: list[Any], func: Any, fmt: Format, nearest: bool = True) -> list[Any]:
    """The arguments in float64, the product's factors first converted to the format."""
    factors = FACTORS[func]
    return [
        (rounded(t, fmt, nearest) if i in factors else t).to(torch.float64)
        if isinstance(t, torch.Tensor)
        else t
        for i, t in enumerate(args)
    ]


# the conversions a measured error is set beside: (format, to nearest)
CONVERSIONS: dict[str, tuple[Format, bool]] = {
    "tf32": ("tf32", True),
    "tf32 truncated": ("tf32", False),
    "bf16": ("bf16", True),
    "bf16 truncated": ("bf16", False),
}


def measure_one(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device: str, seed: int = 0
) -> Measured | None:
    """One contraction at the recorded shapes, run as the user's flags have it, against float64 truth on
    a slice of its output; None where its output is empty or exact zeros."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def real(a: Any) -> Any:
        return torch.randn(a.shape, generator=gen, device=device) if isinstance(a, Spec) else a

    filled = [real(a) for a in args]
    with torch.no_grad():
        out = func(*filled, **kwargs)
        sliced, index = sample(func, filled)
        got = out[index].clone()
        del out
        truth = func(*_wide(sliced, func, "ieee"), **kwargs)
        errors = {
            name: _error(func(*_wide(sliced, func, f, near), **kwargs), truth)
            for name, (f, near) in CONVERSIONS.items()
        }
    if truth.numel() == 0 or not all(errors.values()):
        return None
    error = _error(got, truth)
    fmt: Format = "ieee"
    if error >= EXPLAINS * errors["tf32"]:  # the conversion whose error is nearest the one measured
        closest = min(errors, key=lambda name: abs(math.log(error / errors[name])))
        fmt = CONVERSIONS[closest][0]
    return Measured(
        op=str(func.__name__).split(".")[0],
        kind=KIND[func],
        shape=list(args[FACTORS[func][0]].shape),
        sampled=truth.numel(),
        error=error,
        converted=errors,
        format=fmt,
    )


ORDER: dict[Format, int] = {"ieee": 0, "tf32": 1, "bf16": 2}


def measure(problem: Problem, shape: dict[str, Any], device: str) -> Accuracy:
    """The regime of the reference's float32 contractions at `shape` (the primary shape on the run's
    device) on `device`: each kind's coarsest format measured. A reference that cannot be traced on
    the meta device is named in the note and counts as IEEE (the stricter bar)."""
    strict = problem.strict_fp32
    try:
        calls = contractions(problem, shape)
    except Exception as e:  # a reference that needs real values: its contractions are not measured
        return Accuracy(device=device, strict=strict, note=f"contractions not measured ({type(e).__name__})")
    measured: list[Measured] = []
    for func, args, kwargs in calls[:MEASURED]:
        try:  # out of memory propagates: the pool's fault (others hold the device), the analysis retried
            m = measure_one(func, args, kwargs, device)
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        if m is not None:
            measured.append(m)
    regimes: dict[Kind, Format] = {}
    for m in measured:
        if ORDER[m.format] > ORDER[regimes.get(m.kind, "ieee")]:
            regimes[m.kind] = m.format
    note = f"{len(calls) - MEASURED} more contractions not measured" if len(calls) > MEASURED else ""
    return Accuracy(device=device, regimes=regimes, measured=measured, strict=strict, note=note)
