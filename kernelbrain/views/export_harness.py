"""The check-and-time harness `kb export` appends to a standalone kernel module.

Everything below HARNESS_START is copied verbatim into the exported file, after the candidate's
source and the reference problem's source (kept as a string), so it must import nothing from
kernelbrain and define nothing whose name could clash with a candidate's: every name starts with
`_kb_` or `_Kb`, and imports are local to the functions. It re-states, in a few lines, what kb's gate and
ladder do (kernelbrain.child): same shapes, same tolerances, the reference in float64 as the
judge, CUDA events with an L2 flush on a GPU, the wall clock under the Triton interpreter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotations' strings alone: the exported file imports inside its functions
    import torch

# --- HARNESS_START ---


def _kb_load_reference(source, name="kb_reference"):
    """The reference problem as a module of its own: its globals (shapes, Model) never meet ModelNew's."""
    import sys
    import types

    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module  # dataclasses and pickling look classes up by module name
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def _kb_derived(source: str) -> list[tuple[str, object, set[str]]]:
    """The module constants the file computes from others (`bias_shape = (out_channels, 1, 1)`), as kb's
    child finds them (kernelbrain/child/loading.py): (name, code, names read), in source order."""
    import ast

    pure = (ast.Expression, ast.Tuple, ast.List, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load)
    out: list[tuple[str, object, set[str]]] = []
    for node in ast.parse(source).body:
        if not (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            continue
        expr = ast.Expression(node.value)
        reads = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        if reads and all(isinstance(n, (*pure, ast.operator, ast.unaryop)) for n in ast.walk(expr)):
            out.append((node.targets[0].id, compile(expr, "<derived>", "eval"), reads))
    return out


def _kb_shape_label(shape):
    return ",".join(f"{k}={v}" for k, v in shape.items()) or "default"


class _KbProblem:
    """A KernelBench problem plus kb's optional KB_SHAPES, KB_SMOKE_SHAPE, KB_GATE_SHAPES, KB_TOLERANCE,
    KB_EVAL."""

    def __init__(self, module, default_tolerance, reference_multiple, derived=()):
        self.module = module
        self.derived = derived  # _kb_derived(its source): set from a shape's sizes, as kb's child does
        self.reference_multiple = reference_multiple
        self.base = {k: v for k, v in vars(module).items() if not k.startswith("__")}
        self.shapes = [dict(s) for s in (getattr(module, "KB_SHAPES", None) or [{}])]
        smoke = getattr(module, "KB_SMOKE_SHAPE", None)
        self.smoke = dict(smoke) if smoke else None
        self.gate = [dict(s) for s in (getattr(module, "KB_GATE_SHAPES", None) or [])]
        self.tolerance = {**default_tolerance, **(getattr(module, "KB_TOLERANCE", None) or {})}
        # the mode the modules run in, as kb's gate ran them: as constructed, or eval where KB_EVAL says
        self.eval_mode = bool(getattr(module, "KB_EVAL", False))

    def use(self, shape):
        for k, v in self.base.items():
            setattr(self.module, k, v)
        for k, v in shape.items():
            setattr(self.module, k, v)
        changed = set(shape)
        for name, code, reads in self.derived:
            if name not in shape and reads & changed:
                setattr(self.module, name, eval(code, vars(self.module)))
                changed.add(name)

    def inputs(self, shape, seed, device):
        import torch

        self.use(shape)
        torch.manual_seed(seed)
        with torch.device(device):
            xs = self.module.get_inputs()
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]

    def size(self, shape):
        import torch

        return sum(x.numel() for x in self.inputs(shape, 0, "meta") if isinstance(x, torch.Tensor))

    def shapes_for(self, device, every):
        """Timed: on a GPU the primary shape (or every shape); on the CPU the smoke shape, as kb's ladder."""
        if device == "cpu":
            return [self.smoke if self.smoke is not None else min(self.shapes, key=self.size)]
        return self.shapes if every else self.shapes[:1]

    def check_shapes(self, device):
        """Checked, as kb's gate: the CPU shape; on a GPU KB_GATE_SHAPES, else the smallest shape of each
        input-dtype group (a float64 reference at a large benchmark shape can take longer than a run)."""
        import torch

        if device == "cpu":
            return self.shapes_for("cpu", False)
        if self.gate:
            return self.gate
        groups = {}
        for s in self.shapes:
            key = tuple(str(x.dtype) for x in self.inputs(s, 0, "meta") if isinstance(x, torch.Tensor))
            groups.setdefault(key, []).append(s)
        return [min(g, key=self.size) for g in groups.values()]

    def build(self, model_new, shape, device):
        import torch

        self.use(shape)
        init = list(self.module.get_init_inputs())
        torch.manual_seed(1234)
        ref = self.module.Model(*init).to(device)
        torch.manual_seed(1234)
        new = model_new(*init).to(device)
        if self.eval_mode or not ref.training:  # in the reference's mode, as kb's gate builds them
            ref, new = ref.eval(), new.eval()
        a, b = ref.state_dict(), new.state_dict()
        if a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a):
            new.load_state_dict(a)  # same weights in both, as kb's gate does
        return ref, new


def _kb_outputs(out: "torch.Tensor | tuple[object, ...] | list[object]") -> "list[torch.Tensor]":  # noqa: UP037
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    return [o for o in out if isinstance(o, torch.Tensor)]


def _kb_within(got, truth, native, tol, multiple, spread=None):
    """(elements failed, max abs err at the truth's scale): kb's tolerance rule (kernelbrain/child/
    tolerance.py). An element passes within tol + tol |truth| or within `multiple` x the reference's own
    error there (floored at its median where the truth is not zero, and at `spread`: how far the truth
    moves when the inputs move by one rounding of their dtype), where the reference runs at its own dtype
    and the truth in float64. The error is absolute where |truth| <= 1, relative above."""
    import torch

    g, t = got.detach().to(torch.float64), truth.to(torch.float64)
    finite = torch.isfinite(t)
    err = (g - t).abs()
    ref_err = torch.where(finite & torch.isfinite(native), (native.to(torch.float64) - t).abs(), 0)
    measured = ref_err[finite & (t != 0)]  # where the truth is not zero: its exact zeros measure nothing
    floor = float(measured.median()) if measured.numel() else 0.0
    allowed = ref_err.clamp_min(floor)
    if spread is not None:
        allowed = torch.maximum(allowed, spread.to(torch.float64))
    bound = torch.maximum(tol + tol * t.abs(), multiple * allowed)
    ok = ~finite | (err <= bound)
    err = err.masked_fill(~finite, 0) / t.abs().clamp_min(1.0)  # absolute where |t| <= 1, relative above
    return int((~ok).sum()), float(err.max()) if err.numel() else 0.0


def _kb_nudged(x: "object", seed: int) -> "object":  # noqa: UP037 (the export has no __future__)
    """A floating-point input in float64, each element moved by about one rounding of its dtype (times
    1 + g eps / 2, g standard normal; kernelbrain/child/judge.py's nudged)."""
    import torch

    if not (torch.is_tensor(x) and x.is_floating_point()):
        return x
    gen = torch.Generator(device=x.device).manual_seed(1 + seed)
    g = torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float64)
    return x.to(torch.float64) * (1 + g * (torch.finfo(x.dtype).eps / 2))


def _kb_apart(moved: "torch.Tensor", truth: "torch.Tensor") -> "torch.Tensor":  # noqa: UP037
    """|moved - truth| where both are finite floating point of one shape; 0 elsewhere."""
    import torch

    if not (truth.is_floating_point() and moved.shape == truth.shape):
        return torch.zeros_like(truth, dtype=torch.float64)
    gap = (moved.to(torch.float64) - truth).abs()
    return torch.where(torch.isfinite(gap), gap, 0)


def _kb_check(problem, ref, new, shape, device, seeds):
    """(passed, max abs err, tolerance, detail): ModelNew against the float64 reference on `seeds` draws,
    its outputs and, after each call (from the state as built), the running state kb's gate compares:
    the running statistics of torch's norms in training mode, a batch counter only where it weighs the
    running average (momentum None), as kernelbrain/child/loading.py's running_state."""
    import copy

    import torch

    ref64 = copy.deepcopy(ref).to(torch.float64)
    running = []
    for name, sub in ref.named_modules():
        if isinstance(sub, torch.nn.modules.batchnorm._NormBase) and sub.training:
            for b, v in sub.named_buffers(recurse=False):
                if v is not None and not (b == "num_batches_tracked" and sub.momentum is not None):
                    running.append(f"{name}.{b}" if name else b)
    running.sort()  # in the judge's order
    missing = [k for k in running if k not in new.state_dict()]
    if missing:
        return (
            False,
            0.0,
            0.0,
            f"ModelNew keeps no {', '.join(missing)}: the reference updates it in training mode",
        )
    others = [copy.deepcopy(ref64) for _ in range(3)]  # truths on inputs moved by a rounding: the spread
    models = (ref, ref64, new, *others)
    built = [{k: v.clone() for k, v in m.state_dict().items() if k in running} for m in models]
    worst, tol = 0.0, 0.0
    with torch.no_grad():
        for seed in range(seeds):
            for m, start in zip(models, built, strict=True):
                state = m.state_dict()
                for k, v in start.items():
                    state[k].copy_(v)
            inputs = problem.inputs(shape, seed, device)
            wide = [
                x.to(torch.float64) if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs
            ]
            expected = _kb_outputs(ref64(*wide))
            moved = [_kb_outputs(o(*[_kb_nudged(x, j) for x in inputs])) for j, o in enumerate(others)]
            native = _kb_outputs(ref(*[x.clone() if torch.is_tensor(x) else x for x in inputs]))
            got = _kb_outputs(new(*inputs))
            if len(got) != len(expected):
                return False, worst, tol, f"{len(got)} outputs, the reference returns {len(expected)}"
            n = len(got)
            for m, out in ((ref64, expected), (ref, native), (new, got), *zip(others, moved, strict=True)):
                state = m.state_dict()
                out += [state[k] for k in running]
            for i, (g, e) in enumerate(zip(got, expected, strict=True)):
                what = (
                    f"output {i}" if i < n else f"running state {running[i - n]} (updated in training mode)"
                )
                if (g.dtype, g.shape) != (native[i].dtype, native[i].shape):  # before any error: as kb's gate
                    want = f"{str(native[i].dtype).removeprefix('torch.')} {tuple(native[i].shape)}"
                    have = f"{str(g.dtype).removeprefix('torch.')} {tuple(g.shape)}"
                    return False, worst, tol, f"{what} is {have}; the reference returns {want}"
                tol = problem.tolerance.get(str(native[i].dtype).removeprefix("torch."), 1e-4)
                spread = torch.stack([_kb_apart(m[i], e) for m in moved]).square().mean(0).sqrt()
                failed, err = _kb_within(g, e, native[i], tol, problem.reference_multiple, spread)
                worst = max(worst, err)
                if failed:
                    return (
                        False,
                        worst,
                        tol,
                        f"seed {seed}: {what} differs at {failed} of {e.numel()} elements",
                    )
    return True, worst, tol, ""


def _kb_time(fn, device, flush):
    import time

    import torch

    if device == "cpu":
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    flush.zero_()  # every timed call starts with a cold L2
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _kb_bench(problem, ref, new, shape, device, repeats, warmup):
    """Median seconds of (ModelNew, reference), interleaved call by call on three rotating inputs."""
    import gc
    import statistics

    import torch

    sets = [problem.inputs(shape, 100 + i, device) for i in range(3)]
    flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device=device) if device == "cuda" else None
    new_t, ref_t = [], []
    with torch.no_grad():
        new(*sets[0])  # Triton compiles here, outside the timing
        for i in range(warmup):
            ref(*sets[i % 3])
            new(*sets[i % 3])
        gc.collect()
        gc.disable()
        try:
            for i in range(repeats):
                args = sets[i % 3]
                ref_t.append(_kb_time(lambda a=args: ref(*a), device, flush))
                new_t.append(_kb_time(lambda a=args: new(*a), device, flush))
        finally:
            gc.enable()
    return statistics.median(new_t), statistics.median(ref_t)


def _kb_fmt_s(seconds):
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _kb_main(model_new, reference_source, default_tolerance, reference_multiple, argv=None, cpu_shape=None):
    """`python kernel.py`: check ModelNew against the reference, time both, print the speedup; 0 on a pass."""
    import argparse
    import os
    import sys

    import torch

    p = argparse.ArgumentParser(description="Check ModelNew against the reference problem and time both.")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument(
        "--all-shapes", action="store_true", help="every KB_SHAPES entry, not just the primary (GPU)"
    )
    p.add_argument("--seeds", type=int, default=3, help="input draws the check compares (default 3)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls each (default: 100 GPU, 5 CPU)")
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed calls each first (default: 10 GPU, 2 CPU)"
    )
    args = p.parse_args(argv)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print(
            "error: no GPU; run `TRITON_INTERPRET=1 python kernel.py` to check the kernels on the CPU "
            "through the Triton interpreter",
            file=sys.stderr,
        )
        return 2
    repeats = args.repeats or (100 if device == "cuda" else 5)
    warmup = args.warmup if args.warmup is not None else (10 if device == "cuda" else 2)
    timer = "CUDA events" if device == "cuda" else "wall clock, Triton interpreter"
    module = _kb_load_reference(reference_source)
    problem = _KbProblem(module, default_tolerance, reference_multiple, _kb_derived(reference_source))
    if problem.smoke is None and cpu_shape is not None:
        problem.smoke = dict(cpu_shape)  # what kb's CPU run used: the file's full size never finishes
    failed = False
    for shape in problem.check_shapes(device):
        label = _kb_shape_label(shape)
        ref, new = problem.build(model_new, shape, device)
        passed, err, tol, detail = _kb_check(problem, ref, new, shape, device, args.seeds)
        if not passed:
            print(f"FAIL {label}: {detail} (max abs err {err:.3g}, tolerance {tol:g})")
            failed = True
        else:
            print(
                f"PASS {label}: matches the reference on {args.seeds} seeds "
                f"(max abs err {err:.3g}, tolerance {tol:g})"
            )
    if failed:
        return 1  # a wrong kernel's speed means nothing
    for shape in problem.shapes_for(device, args.all_shapes):
        label = _kb_shape_label(shape)
        ref, new = problem.build(model_new, shape, device)
        cand_s, ref_s = _kb_bench(problem, ref, new, shape, device, repeats, warmup)
        print(
            f"speedup {ref_s / cand_s:.3g}x at {label}: ModelNew {_kb_fmt_s(cand_s)} vs reference "
            f"{_kb_fmt_s(ref_s)} (median of {repeats}, {timer})"
        )
    return 0
