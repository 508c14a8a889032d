"""What runs inside a sandboxed child: load a problem and a candidate, gate, time, analyse, profile.

Imported only by `kernelbrain.child`, never by a worker: everything here executes user code.
Each public function takes and returns plain JSON-able values (the sandbox protocol).
"""

from __future__ import annotations

import ast
import copy
import gc
import hashlib
import importlib.util
import inspect
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kernelbrain import guard
from kernelbrain.problem import DEFAULT_TOLERANCE, shape_label

_MODULES: dict[str, ModuleType] = {}


class CandidateFault(Exception):
    """A candidate failed a check; `category` is one of GateFailed's categories."""

    def __init__(self, category: str, detail: str, **figures: float | None) -> None:
        super().__init__(detail)
        self.category = category
        self.detail = detail
        self.figures = figures


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
        self.hash = hashlib.sha256(source.encode()).hexdigest()
        m = self.module
        self.base_globals = {k: getattr(m, k) for k in dir(m) if not k.startswith("__")}
        shapes = getattr(m, "KB_SHAPES", None) or [{}]
        self.shapes: list[dict] = [dict(s) for s in shapes]
        smoke = getattr(m, "KB_SMOKE_SHAPE", None)
        self.smoke: dict | None = dict(smoke) if smoke else None
        # shapes the GPU gate checks instead of the smallest of each dtype: a problem whose every
        # shape is huge (a float64 reference of 500M outputs, three seeds) names cheaper ones here
        self.gate: list[dict] | None = [dict(s) for s in getattr(m, "KB_GATE_SHAPES", None) or []] or None
        self.tolerance = {**DEFAULT_TOLERANCE, **(getattr(m, "KB_TOLERANCE", None) or {})}

    def tolerance_of(self, dtype: torch.dtype) -> float:
        return self.tolerance.get(str(dtype).removeprefix("torch."), 1e-4)

    def use(self, shape: dict) -> None:
        for k, v in self.base_globals.items():
            setattr(self.module, k, v)
        for k, v in shape.items():
            setattr(self.module, k, v)

    def inputs(self, shape: dict, seed: int, device: str = "cpu") -> list:
        """get_inputs() at a shape, drawn on the device itself: a GPU-sized tensor is never built on
        the host first. Tensors the problem puts on another device explicitly are moved."""
        self.use(shape)
        torch.manual_seed(seed)
        with torch.device(device):
            return [_to(x, device) for x in self.module.get_inputs()]

    def init_inputs(self, shape: dict) -> list:
        self.use(shape)
        return list(self.module.get_init_inputs())

    def ladder_shapes(self, device: str, which: str) -> list[dict]:
        """The shapes a rung measures: the smoke shape on CPU, else smallest/primary/all."""
        if device == "cpu":
            return [self.smoke if self.smoke is not None else self.smallest()]
        if which == "primary":
            return [self.shapes[0]]
        if which == "smallest":
            return [self.smallest()]
        return self.shapes

    def gate_shapes(self, device: str) -> list[dict]:
        """The shapes the gate checks: the CPU shape, or on GPU the problem's KB_GATE_SHAPES, else the
        smallest of each input-dtype group."""
        if device == "cpu":
            return self.ladder_shapes("cpu", "smallest")
        if self.gate is not None:
            return self.gate
        groups: dict[tuple, list[dict]] = {}
        for s in self.shapes:
            key = tuple(str(x.dtype) for x in self.inputs(s, 0, "meta") if isinstance(x, torch.Tensor))
            groups.setdefault(key, []).append(s)
        return [min(g, key=self._size) for g in groups.values()]

    def _size(self, shape: dict) -> int:
        return sum(_numel(x) for x in self.inputs(shape, 0, "meta"))

    def smallest(self) -> dict:
        # sized on the meta device: no memory is touched to compare shapes
        return min(self.shapes, key=self._size)


def _numel(x: Any) -> int:
    return x.numel() if isinstance(x, torch.Tensor) else 0


def _to(x: Any, device: str, dtype: torch.dtype | None = None) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.to(device)
        return x.to(dtype) if dtype is not None and x.is_floating_point() else x
    return x


def _signature(fn: Callable) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in list(inspect.signature(fn).parameters.values())[1:]]


def _construct(cls: type, init: list, device: str) -> torch.nn.Module:
    """cls(*init) built on the device, so a large layer's weights are drawn there rather than on one
    host core and copied; an __init__ that needs the host (numpy, a CPU generator) is built there and
    moved. Seeded either way."""
    torch.manual_seed(1234)
    if device != "cpu":
        try:
            with torch.device(device):
                return cls(*init).to(device).eval()
        except Exception:
            torch.manual_seed(1234)
    return cls(*init).to(device).eval()


def _build(problem: Problem, cand: ModuleType | None, shape: dict, device: str):
    init = problem.init_inputs(shape)
    ref = _construct(problem.module.Model, init, device)
    if cand is None:
        return ref, None
    new = _construct(cand.ModelNew, init, device)
    ref_state, new_state = ref.state_dict(), new.state_dict()
    if ref_state.keys() == new_state.keys() and all(
        ref_state[k].shape == new_state[k].shape for k in ref_state
    ):
        new.load_state_dict(ref_state)
    return ref, new


def _variant(inputs: list, seed: int) -> list:
    """Seed 0: the problem's own draw. Later seeds: signed, larger-magnitude values of the same shapes."""
    if seed == 0:
        return inputs
    scale = 1.0 if seed % 2 else 8.0
    # drawn where the input lives: a host draw of a GPU gate shape's tens of millions of float64 values
    # cost seconds a seed
    gens: dict[torch.device, torch.Generator] = {}
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            g = gens.setdefault(x.device, torch.Generator(device=x.device).manual_seed(seed))
            x = (torch.randn(x.shape, generator=g, dtype=torch.float64, device=x.device) * scale).to(x.dtype)
        out.append(x)
    return out


def _outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [o for o in out if isinstance(o, torch.Tensor)]
    raise CandidateFault("mismatch", f"forward returned {type(out).__name__}, not a tensor")


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
        want, got = _signature(getattr(ref_cls, method)), _signature(getattr(new_cls, method))
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


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _fingerprint(t: torch.Tensor) -> tuple:
    """A tensor's shape, dtype and the wrapping sum of its bits: two tensors with equal fingerprints
    are equal but for a collision, NaNs included (their bits are summed, not their values)."""
    as_int = _SAME_SIZE_INT.get(t.element_size())
    bits = t.view(as_int) if as_int is not None else t.contiguous().view(torch.uint8)
    return tuple(t.shape), str(t.dtype), int(bits.sum(dtype=torch.int64)) if t.numel() else 0


class _Memo:
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
        tensors = _tensors(value)
        size = sum(t.numel() * t.element_size() for t in tensors)
        if self.bytes + size <= self.LIMIT_BYTES.get(tensors[0].device.type if tensors else "cpu", 1 << 30):
            self.entries[key] = (value, [_fingerprint(t) for t in tensors])
            self.bytes += size
        return value

    def clear(self, problem: str = "") -> None:
        self.problem, self.entries, self.bytes = problem, {}, 0

    def intact(self) -> bool:
        """Whether every kept tensor still holds what it held when kept; if not, the memo is emptied."""
        ok = all(
            [_fingerprint(t) for t in _tensors(value)] == prints for value, prints in self.entries.values()
        )
        if not ok:
            self.clear()
        return ok


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


_MEMO = _Memo()


def _layout_copy(x: Any) -> Any:
    """A copy of a tensor with its own layout (offset, strides, overlap): a clone would be contiguous,
    and a candidate that ignores strides would pass on it."""
    if not isinstance(x, torch.Tensor):
        return copy.deepcopy(x)
    out = torch.empty(0, dtype=x.dtype, device=x.device)
    return out.set_(x.untyped_storage().clone(), x.storage_offset(), x.size(), x.stride())


def _reference_draw(
    problem: Problem, ref: torch.nn.Module, shape: dict, device: str, seed: int, weights: tuple
) -> tuple[list, list[torch.Tensor]]:
    """A seed's inputs at a gate shape and the float64 reference's outputs on them, from the memo.
    `weights` (fingerprints of the reference's state_dict) is part of the key: a Model whose init does
    not follow torch.manual_seed (numpy, say) gets a new reference with each build."""

    def make() -> tuple[list, list[torch.Tensor]]:
        ref64 = copy.deepcopy(ref).to(torch.float64)
        inputs = [_to(x, device) for x in _variant(problem.inputs(shape, seed, device), seed)]
        with torch.no_grad():
            return inputs, _outputs(ref64(*[_to(x, device, torch.float64) for x in inputs]))

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
            ref, new = _build(problem, cand, shape, device)
        except Exception as e:
            raise CandidateFault(
                "runtime", f"ModelNew(*get_init_inputs()) raised {type(e).__name__}: {e}"
            ) from e
        forbidden = _MEMO.get(
            problem.hash,
            ("forbidden", device, shape_label(shape)),
            lambda r=ref, s=shape: guard.forbidden_ops(_record_calls(r, problem.inputs(s, 0, device))),
        )
        weights = tuple(_fingerprint(t) for t in ref.state_dict().values())
        previous: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        for seed in range(seeds):
            # the memo's inputs stay as drawn: the candidate gets copies, and is checked against them
            before, expected = _reference_draw(problem, ref, shape, device, seed, weights)
            inputs = [_layout_copy(x) for x in before]
            with torch.no_grad():
                watch = guard.Watch(forbidden, problem.module.Model, device)
                try:
                    with watch:
                        got = _outputs(new(*inputs))
                        if device == "cuda":
                            torch.cuda.synchronize()
                except CandidateFault:
                    raise
                except Exception as e:
                    raise CandidateFault(
                        "runtime", f"{where}seed {seed}: forward raised {type(e).__name__}: {e}"
                    ) from e
                _policy(watch.check, prefix=f"{where}seed {seed}: ")
                _policy(guard.check_timers, timers, prefix=f"{where}seed {seed}: ")
            for x, b in zip(inputs, before, strict=True):
                if isinstance(x, torch.Tensor) and not torch.equal(x, b):
                    raise CandidateFault("policy", f"{where}seed {seed}: the candidate mutated its inputs")
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
                g64 = g.detach().to(torch.float64)
                bad_g, bad_e = ~torch.isfinite(g64), ~torch.isfinite(e)
                if (bad_g & ~bad_e).any():
                    raise CandidateFault(
                        "nan",
                        f"{where}seed {seed}: output {i} has {int((bad_g & ~bad_e).sum())} NaN/Inf where "
                        "the reference has none (outputs are allocated NaN-filled: are some elements never "
                        "written?)",
                    )
                ok = bad_e | torch.isclose(g64, e, rtol=tol, atol=tol)
                diff = (g64 - e).abs().masked_fill(bad_e, 0)
                abs_err = float(diff.max()) if diff.numel() else 0.0
                rel_err = (
                    float((diff / e.abs().clamp_min(1e-12)).masked_fill(bad_e, 0).max())
                    if diff.numel()
                    else 0.0
                )
                worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
                if not bool(ok.all()):
                    raise CandidateFault(
                        "mismatch",
                        f"{where}seed {seed}: output {i} differs from the reference at {int((~ok).sum())} "
                        f"of {ok.numel()} "
                        f"elements (max abs err {abs_err:.3g}, tolerance {tol:g})",
                        max_abs_err=abs_err,
                        max_rel_err=rel_err,
                    )
    return {"seeds": seeds, "max_abs_err": worst_abs, "max_rel_err": worst_rel, "tolerance": tol}


# --- timing --------------------------------------------------------------------------------------


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return statistics.median(xs), q[2] - q[0]


class _Timer:
    """CUDA events with an L2 flush before each sample on GPU; wall clock under the interpreter.

    A sample is `calls` back-to-back calls between one event pair, divided by `calls`: a kernel of a
    few microseconds is shorter than the jitter of one launch, so it is timed as a batch (the flush
    still precedes each batch, so only the batch's first call starts with a cold L2)."""

    # a sample shorter than this is dominated by launch jitter: batch calls up to it (GPU only)
    MIN_SAMPLE_S = 200e-6
    MAX_CALLS = 100

    def __init__(self, device: str) -> None:
        self.device = device
        self.name = "cuda-events" if device == "cuda" else "interpreter-wallclock"
        # 256 MiB: several times the H200's 50 MiB L2, so a timed call never starts warm
        self.flush = (
            torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda") if device == "cuda" else None
        )

    def __call__(self, fn: Callable[[], Any], calls: int = 1) -> float:
        if self.flush is None:
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - t) / calls
        self.flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls

    def calls_for(self, *fns: Callable[[], Any]) -> int:
        """Calls per sample for this shape, the same for every contender: enough that the fastest
        one's sample lasts MIN_SAMPLE_S (1 under the interpreter, where a call takes milliseconds)."""
        if self.flush is None:
            return 1
        fastest = min(min(self(fn) for _ in range(3)) for fn in fns)
        return max(1, min(self.MAX_CALLS, math.ceil(self.MIN_SAMPLE_S / max(fastest, 1e-9))))


# a benchmark shape's outputs fail only past this many times the gate's tolerance (see _screen)
SCREEN = 10
_SLICE = 1 << 24  # elements compared at once: no temporaries the size of a large output


def _screen(problem: Problem, shape: dict, got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """A benchmark shape's first outputs against the reference's, on the device. The gate checked the
    candidate closely (float64, several draws) at its small shapes; here only errors SCREEN times its
    tolerance fail: those a kernel makes only at scale (a grid-wide wait on programs that never ran,
    a 32-bit offset that wrapped, tiles never written), where eager's own rounding is far inside.

    Two tests, each at SCREEN x tol: elementwise (|g - e| <= tol + tol |e|), and per line of the last
    dimension, the error's RMS against the reference's (floored at 1e-3 of the whole output's). The
    second sees what an absolute tolerance cannot: a softmax row of 393216 columns holds values near
    2.5e-6, so a row normalised by half its sum is wrong by far less than 1e-3 at every element."""
    where = f"benchmark shape {shape_label(shape)}"
    if len(got) != len(expected):
        raise CandidateFault(
            "mismatch", f"{where}: {len(got)} outputs, the reference returns {len(expected)}"
        )
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g.shape != e.shape:
            raise CandidateFault(
                "mismatch", f"{where}: output {i} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
            )
        if e.numel() == 0:
            continue
        tol = SCREEN * problem.tolerance_of(g.dtype)
        wide = torch.float64 if torch.float64 in (g.dtype, e.dtype) else torch.float32
        g, e = g.detach(), e.detach()
        if g.dim() < 2:  # one line
            g, e = g.reshape(1, -1), e.reshape(1, -1)
        rows = max(1, _SLICE // max(1, e[0].numel()))
        bad, err_rms, ref_rms = 0, [], []
        for gs, es in zip(g.split(rows), e.split(rows), strict=True):
            gs, es = gs.reshape(-1, gs.shape[-1]).to(wide), es.reshape(-1, es.shape[-1]).to(wide)
            # where the reference is not finite, any value goes (the gate judged those)
            finite = torch.isfinite(es)
            bad += int((finite & ~torch.isclose(gs, es, rtol=tol, atol=tol)).sum())
            es = torch.where(finite, es, 0)
            err_rms.append(torch.where(finite, gs - es, 0).square().mean(-1).sqrt())  # NaN in gs stays NaN
            ref_rms.append(es.square().mean(-1).sqrt())
        err, ref = torch.cat(err_rms), torch.cat(ref_rms)
        floor = 1e-3 * float(ref.square().mean().sqrt())  # the whole output's RMS: lines are equally long
        lines = int((~(err <= tol * ref.clamp_min(floor))).sum())
        if bad or lines:
            raise CandidateFault(
                "mismatch",
                f"{where}: output {i} differs from the reference at {bad} of {e.numel()} elements and in "
                f"{lines} of {len(err)} lines by more than {SCREEN}x the tolerance ({tol:g}): a fault only "
                "at this size? (a wait on programs that never ran, a 32-bit offset, tiles never written)",
            )


def bench(problem_source: str, cand_source: str, device: str, which: str, repeats: int, warmup: int) -> dict:
    """Candidate and reference timed in this process, interleaved, on rotating fresh inputs."""
    problem = Problem(problem_source)
    cand = load_module(cand_source, "cand")
    timer = _Timer(device)
    shapes = []
    with torch.no_grad():
        for shape in problem.ladder_shapes(device, which):
            ref, new = _build(problem, cand, shape, device)
            sets = [problem.inputs(shape, 100 + i, device) for i in range(3)]
            t0 = time.perf_counter()
            got = _outputs(new(*sets[0]))  # first call: Triton compiles (and autotunes) here, untimed
            if device == "cuda":
                torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            _screen(problem, shape, got, _outputs(ref(*sets[0])))
            del got
            for i in range(warmup):
                ref(*sets[i % 3])
                new(*sets[i % 3])
            ref_t, new_t = [], []
            calls = timer.calls_for(lambda f=ref, a=sets[0]: f(*a), lambda f=new, a=sets[0]: f(*a))
            # the interpreter leaves garbage behind: no collection may land inside a timed call
            gc.collect()
            gc.disable()
            try:
                for i in range(repeats):
                    args = sets[i % 3]
                    ref_t.append(timer(lambda a=args, f=ref: f(*a), calls))
                    new_t.append(timer(lambda a=args, f=new: f(*a), calls))
            finally:
                gc.enable()
            (cm, ci), (rm, ri) = _quartiles(new_t), _quartiles(ref_t)
            shapes.append(
                {
                    "shape": shape_label(shape),
                    "cand_median_s": cm,
                    "cand_iqr_s": ci,
                    "ref_median_s": rm,
                    "ref_iqr_s": ri,
                    "repeats": repeats,
                    "speedup": rm / cm if cm > 0 else 0.0,
                    "compile_s": compile_s,
                    "calls": calls,
                }
            )
    return {"shapes": shapes, "timer": timer.name}


def duel(
    problem_source: str, a_source: str, b_source: str, device: str, which: str, repeats: int, warmup: int
) -> dict:
    """Two candidates timed interleaved (A, B, B, A, A, B, ...: neither always goes first) on the same
    rotating inputs; per pair, the ratio of A's time to B's (geometric mean over the rung's shapes)."""
    problem = Problem(problem_source)
    ma, mb = load_module(a_source, "cand"), load_module(b_source, "cand")
    timer = _Timer(device)
    logs = [0.0] * repeats
    shapes = problem.ladder_shapes(device, which)
    with torch.no_grad():
        for shape in shapes:
            (_, na), (_, nb) = _build(problem, ma, shape, device), _build(problem, mb, shape, device)
            sets = [problem.inputs(shape, 200 + i, device) for i in range(3)]
            for i in range(warmup + 1):  # the first call compiles
                na(*sets[i % 3])
                nb(*sets[i % 3])
            calls = timer.calls_for(lambda f=na, a=sets[0]: f(*a), lambda f=nb, a=sets[0]: f(*a))
            gc.collect()
            gc.disable()
            try:
                for i in range(repeats):
                    args = sets[i % 3]
                    order = (na, nb) if i % 2 == 0 else (nb, na)
                    t = {id(f): timer(lambda a=args, f=f: f(*a), calls) for f in order}
                    logs[i] += math.log(t[id(na)] / t[id(nb)]) / len(shapes)
            finally:
                gc.enable()
    return {"ratios": [math.exp(x) for x in logs], "timer": timer.name}


# --- analysis and the analytical roofline -----------------------------------------------------


def _record_calls(model: torch.nn.Module, inputs: list) -> list[dict]:
    from torch.overrides import TorchFunctionMode

    calls: list[dict] = []

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", str(func))
            if name not in {"__get__", "__set__", "dim", "size", "shape", "__len__"}:
                detail: dict[str, Any] = {"op": name}
                tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
                if tensor is not None:
                    detail["ndim"] = tensor.dim()
                    detail["shape"] = list(tensor.shape)
                    detail["dtype"] = str(tensor.dtype).removeprefix("torch.")
                for k in ("dim", "keepdim", "p", "eps"):
                    if k in kwargs and isinstance(kwargs[k], int | float | bool | tuple | list):
                        detail[k] = kwargs[k]
                if "dim" not in detail and len(args) > 1 and isinstance(args[1], int):
                    detail["dim"] = args[1]
                if detail not in calls:
                    calls.append(detail)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Recorder():
        model(*inputs)
    return calls


def _traced(device: str, fn: Callable[[str], Any]) -> tuple[Any, str]:
    """fn(where) on the meta device, where tensors have shapes and dtypes but no data: the counts need
    no memory and no GPU time. A reference that needs real values (.item(), a data-dependent shape)
    fails there and runs on `device`."""
    try:
        return fn("meta"), "meta"
    except Exception:
        return fn(device), device


def _flops_and_bytes(problem: Problem, shape: dict, device: str) -> tuple[float, float]:
    """Of the reference at a shape, counted from shapes alone (see _traced)."""
    return _traced(device, lambda where: _count(problem, shape, where))[0]


def _count(problem: Problem, shape: dict, device: str) -> tuple[float, float]:
    from torch.utils.flop_counter import FlopCounterMode

    ref, _ = _build(problem, None, shape, device)
    inputs = problem.inputs(shape, 0, device)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        out = _outputs(ref(*inputs))
    flops = float(counter.get_total_flops())
    if flops == 0:  # elementwise and reductions: FlopCounterMode counts only matmul-like ops
        flops = float(sum(o.numel() for o in out) + sum(_numel(x) for x in inputs))
    nbytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    nbytes += sum(o.numel() * o.element_size() for o in out)
    nbytes += sum(p.numel() * p.element_size() for p in ref.parameters())
    return flops, float(nbytes)


def analyse(problem_source: str, device: str) -> dict:
    problem = Problem(problem_source)
    shape = problem.ladder_shapes(device, "primary")[0]

    def trace(where: str) -> tuple[list[dict], tuple[float, float]]:
        ref, _ = _build(problem, None, shape, where)
        return _record_calls(ref, problem.inputs(shape, 0, where)), _count(problem, shape, where)

    (ops, (flops, nbytes)), traced_on = _traced(device, trace)
    labels = [shape_label(s) for s in problem.shapes]
    model_cls = problem.module.Model
    signature = {m: [n for n, _ in _signature(getattr(model_cls, m))] for m in ("__init__", "forward")}
    return {
        "ops": ops,
        "flops": flops,
        "bytes": nbytes,
        "shapes": labels,
        "signature": {"init": signature["__init__"], "forward": signature["forward"]},
        "traced_on": traced_on,  # "meta": the analysis used no GPU time
    }


_CEILINGS: dict[str, dict[str, float]] = {}


def ceilings(device: str) -> dict[str, float]:
    """Measured copy bandwidth (bytes/s) and fp32 matmul rate (FLOP/s) of this device, once per child."""
    if device in _CEILINGS:
        return _CEILINGS[device]
    timer = _Timer(device)
    n = (256 if device == "cuda" else 8) * 1024 * 1024
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    copy_t = min(timer(lambda: dst.copy_(src)) for _ in range(5))
    m = 4096 if device == "cuda" else 512
    a, b = torch.rand(m, m, device=device), torch.rand(m, m, device=device)
    mm_t = min(timer(lambda: a @ b) for _ in range(5))
    _CEILINGS[device] = {"bandwidth_Bps": 2 * n * 4 / copy_t, "matmul_flops": 2 * m**3 / mm_t}
    return _CEILINGS[device]


def roofline(
    problem_source: str,
    cand_source: str,
    device: str,
    repeats: int = 5,
    flops: float | None = None,
    nbytes: float | None = None,
) -> dict:
    """Achieved fractions of the measured memory and compute ceilings at the primary shape. `flops`
    and `nbytes`: the reference's counts there, as the run's analysis recorded them (counting again
    loads torch's FLOP counter, a second or more in every profiler child)."""
    problem = Problem(problem_source)
    cand = load_module(cand_source, "cand")
    shape = problem.ladder_shapes(device, "primary")[0]
    if flops is None or nbytes is None:
        flops, nbytes = _flops_and_bytes(problem, shape, device)
    _, new = _build(problem, cand, shape, device)
    inputs = problem.inputs(shape, 7, device)
    timer = _Timer(device)
    with torch.no_grad():
        new(*inputs)
        gc.collect()
        gc.disable()
        try:
            median = statistics.median(timer(lambda: new(*inputs)) for _ in range(repeats))
        finally:
            gc.enable()
    ceil = ceilings(device)
    floor_s = max(nbytes / ceil["bandwidth_Bps"], flops / ceil["matmul_flops"])
    return {
        "time_s": median,
        "bytes": nbytes,
        "flops": flops,
        "arith_intensity": flops / nbytes if nbytes else math.inf,
        "ridge_intensity": ceil["matmul_flops"] / ceil["bandwidth_Bps"],
        "dram_frac": nbytes / median / ceil["bandwidth_Bps"],
        "compute_frac": flops / median / ceil["matmul_flops"],
        "floor_frac": floor_s / median,
        "bandwidth_Bps": ceil["bandwidth_Bps"],
        "matmul_flops": ceil["matmul_flops"],
    }


def ncu(problem_source: str, cand_source: str, device: str, timeout_s: float = 400.0) -> dict:
    """Nsight Compute on one forward of the candidate at the primary shape (see kernelbrain.ncu)."""
    import subprocess

    from kernelbrain import ncu as nsight

    if device != "cuda" or shutil.which("ncu") is None:
        return {"error": "ncu is not on this machine" if device == "cuda" else "ncu needs a GPU"}
    workdir = Path(tempfile.mkdtemp(prefix="ncu-"))
    (workdir / "problem.py").write_text(problem_source)
    (workdir / "candidate.py").write_text(cand_source)
    cmd = nsight.command(sys.executable, str(workdir / "problem.py"), str(workdir / "candidate.py"))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=workdir)
    except subprocess.TimeoutExpired:
        return {"error": f"ncu took longer than {timeout_s:g} s"}
    try:
        metrics, kernels = nsight.parse(proc.stdout)
    except nsight.NcuError as e:
        return {"error": f"{e} (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"}
    return {"metrics": metrics, "kernels": kernels, "raw": proc.stdout}


_PRISTINE = guard.timer_identities()


def tainted() -> bool:
    """Whether a candidate replaced a clock or a synchronisation point in this process."""
    return any(_PRISTINE[k] is not v for k, v in guard.timer_identities().items() if k in _PRISTINE)


OPS: dict[str, Callable[..., dict]] = {
    "gate": gate,
    "bench": bench,
    "duel": duel,
    "analyse": analyse,
    "roofline": roofline,
    "ncu": ncu,
}
