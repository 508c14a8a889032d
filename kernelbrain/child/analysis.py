"""The reference's analysis: the torch calls it makes, its FLOP and byte counts, its signature."""

from __future__ import annotations

import ast
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelbrain.child import guard, memory, regime
from kernelbrain.child.graph import capture, mark_sized
from kernelbrain.child.loading import (
    Problem,
    build,
    in_mode,
    numel,
    outputs,
    signature,
)
from kernelbrain.core.accuracy import Accuracy
from kernelbrain.core.graph import Graph
from kernelbrain.core.problem import shape_label

# products whose second operand's shape the recorder keeps (the first one's it keeps for every op)
MATMULS = {"matmul", "__matmul__", "mm", "mv", "bmm"}


def record_calls(model: torch.nn.Module, inputs: list) -> list[dict]:
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
                if name in MATMULS and len(args) > 1 and isinstance(args[1], torch.Tensor):
                    detail["other_shape"] = list(args[1].shape)  # a product's N: a vector or a matrix
                if name == "layer_norm":  # the normalised trailing dims: the row length D
                    dims = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
                    dims = [dims] if type(dims) is int else dims
                    if isinstance(dims, list | tuple) and all(type(n) is int for n in dims):
                        detail["normalized_shape"] = list(dims)
                if detail not in calls:
                    calls.append(detail)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Recorder():
        model(*inputs)
    return calls


def traced(device: str, fn: Callable[[str], Any]) -> tuple[Any, str]:
    """fn(where) on the meta device, where tensors have shapes and dtypes but no data: the counts need
    no memory and no GPU time. A reference that needs real values (.item(), a data-dependent shape)
    fails there and runs on `device`."""
    try:
        return fn("meta"), "meta"
    except Exception:
        return fn(device), device


def flops_and_bytes(problem: Problem, shape: dict, device: str) -> tuple[float, float]:
    """Of the reference at a shape, counted from shapes alone (see traced)."""
    return traced(device, lambda where: count(problem, shape, where))[0]


@guard.dynamo_free
class FlopCount(TorchDispatchMode):
    """The FLOPs of the matmul-like ATen ops run under it, by torch's own formulas (the registry behind
    FlopCounterMode, whose module hooks import torch._dynamo: 1.5 s of every run's analysis). An op
    with no formula is decomposed where it can be, so a composite (linear) is counted by its parts."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        from torch.utils.flop_counter import flop_registry

        kwargs = kwargs or {}
        formula = flop_registry.get(func._overloadpacket)
        if formula is None:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def count(problem: Problem, shape: dict, device: str) -> tuple[float, float]:
    ref, _ = build(problem, None, shape, device)
    inputs = problem.inputs(shape, 0, device)
    counter = FlopCount()
    with torch.no_grad(), counter:
        out = outputs(ref(*inputs))
    flops = float(counter.total)
    if flops == 0:  # elementwise and reductions: torch has FLOP formulas for matmul-like ops only
        flops = float(sum(o.numel() for o in out) + sum(numel(x) for x in inputs))
    nbytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    nbytes += sum(o.numel() * o.element_size() for o in out)
    nbytes += sum(p.numel() * p.element_size() for p in ref.parameters())
    return flops, float(nbytes)


def analyse(problem_source: str, device: str) -> dict:
    problem = Problem(problem_source)
    problem.fit_outputs = problem.meta_outputs  # no guard here: fits are checked against the reference
    shape = problem.ladder_shapes(device, "primary")[0]
    modes: list[str] = []

    def trace(where: str) -> tuple[list[dict], dict | None, tuple[float, float]]:
        ref, _ = build(problem, None, shape, where)
        modes.append("training" if ref.training else "eval")
        inputs = problem.inputs(shape, 0, where)
        calls = record_calls(ref, inputs)
        try:  # a graph that cannot be captured only narrows the generators
            graph = capture(ref, inputs).model_dump()
        except Exception:
            graph = None
        return calls, graph, count(problem, shape, where)

    (ops, graph, (flops, nbytes)), traced_on = traced(device, trace)
    primary = problem.shapes[0]
    if graph is not None:  # the numbers that change with the shape, by a second trace on meta
        other = next((s for s in [primary, *_gate_shapes(problem, device)] if s != shape), None)
        second = graph_on_meta(problem, other) if other is not None else None
        if second is not None:
            graph = mark_sized(Graph.model_validate(graph), second).model_dump()
    labels = [shape_label(s) for s in problem.shapes]
    model_cls = problem.module.Model
    names = {m: [n for n, _ in signature(getattr(model_cls, m))] for m in ("__init__", "forward")}
    params = parameter_texts(model_cls.__init__)
    return {
        "ops": ops,
        "flops": flops,
        "bytes": nbytes,
        "shapes": labels,
        "signature": {"init": names["__init__"], "forward": names["forward"], "params": params},
        "traced_on": traced_on,  # "meta": the analysis used no GPU time
        "rung_shapes": [shape_label(s) for s in problem.ladder_shapes(device, "all")],
        "primary_ops": [] if shape == primary else ops_on_meta(problem, primary),
        "fits": fits(problem, device),
        "graph": graph,
        "footprint": footprint(problem, device),
        "gate_footprint": gate_footprint(problem, device),
        "profile_footprint": profile_footprint(problem, device),
        "device_memory": device_memory(device),
        "mode": modes[-1],  # the mode the reference ran in (ProblemAnalysed.mode)
        "accuracy": accuracy(problem, shape, device).model_dump(),
    }


def accuracy(problem: Problem, shape: dict[str, Any], device: str) -> Accuracy:
    """The regime of the reference's contractions at the primary shape on the run's device (child/regime.py);
    where measuring fails, IEEE (the stricter bar), the note saying why."""
    try:
        return regime.measure(problem, shape, device)
    except torch.OutOfMemoryError:
        raise  # others hold the device: the analysis is tried again (runtime/faults.py, DeviceBusy)
    except Exception as e:
        return Accuracy(
            device=device, strict=problem.strict_fp32, note=f"not measured ({type(e).__name__}: {e})"[:200]
        )


# a bench holds this many copies of a shape's inputs: three drawn sets, the slot it loads, and the fresh
# copy a check of the candidate's outputs runs the reference on
BENCH_INPUT_COPIES = 5


def footprint(problem: Problem, device: str) -> float:
    """The most device memory a timed task of the problem needs at a shape its rungs time (0: unknown):
    the bench's input copies, the module's parameters, the reference's working memory at its most (its
    outputs included) and the candidate's outputs beside it (held while the reference's are computed to
    check them), counted on the meta device. What admission (roles/generator.py) holds up against the
    device's memory. (Counting one output, not two, a pool admitted two benches of KernelBench's 6 GiB
    softmax together on an 80 GB H100, and they ran out of memory.)"""
    return _most(problem, problem.ladder_shapes(device, "all"))


def gate_footprint(problem: Problem, device: str) -> float:
    """The same count at the gate's shapes (0: unknown), what a gate reserves on the device: the judge's
    draws hold about as much (the inputs and their float64 copies, the reference run at both precisions),
    and the candidate's child its inputs, outputs and workspace. Small where the gate's shapes were
    fitted; the file's own where a problem refuses a smaller size (in the H100 sweep eight gates of such
    a loss, 4-5 GiB each, ran the device out of memory beside a 30 GiB bench)."""
    return _most(problem, _gate_shapes(problem, device))


def profile_footprint(problem: Problem, device: str) -> float:
    """The same count at the primary shape for one run (0: unknown), what a profile (the roofline's timing,
    an ncu target) reserves: the inputs once, with none of the bench's copies, and what the run writes (the
    reference's peak and the candidate's outputs) twice, since ncu's kernel replay saves and restores what a
    kernel writes. (In the H100 sweep an ncu profile reserved a 42 GiB bench's footprint for its 30-50 s and
    used 13-25 GiB, while four benches of the same size waited for the room.)"""
    return _most(problem, problem.ladder_shapes(device, "primary"), copies=1, writes=2)


def _most(
    problem: Problem, shapes: list[dict[str, Any]], copies: int = BENCH_INPUT_COPIES, writes: int = 1
) -> float:
    most = 0.0
    for shape in shapes:
        try:
            ref, _ = build(problem, None, shape, "meta")
            inputs = problem.inputs(shape, 0, "meta")
            peak = memory.Peak()
            with torch.no_grad(), peak:
                returned = outputs(ref(*inputs))
        except Exception:  # a reference that needs real values: no estimate
            return 0.0
        held = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
        weights = sum(t.numel() * t.element_size() for t in (*ref.parameters(), *ref.buffers()))
        candidate = sum(o.numel() * o.element_size() for o in returned)
        most = max(most, copies * held + weights + writes * (peak.peak + candidate))
    return most


def device_memory(device: str) -> float:
    """What one child may hold: the GPU's memory, or on a CPU the child's own cap (its RLIMIT_DATA)."""
    if device == "cuda":
        return float(torch.cuda.mem_get_info()[1])
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    pages = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return float(pages if soft == resource.RLIM_INFINITY else min(soft, pages))


def fits(problem: Problem, device: str) -> list[dict]:
    """Every shape fitted for this device (the rungs' on CPU, the gate's), for the children after."""
    problem.ladder_shapes(device, "all")
    _gate_shapes(problem, device)
    return [f.model_dump() for f in problem.fits()]


def _gate_shapes(problem: Problem, device: str) -> list[dict]:
    try:
        return problem.gate_shapes(device)
    except Exception:  # the judge's draws say what fails there, as the problem's fault
        return []


def _on_meta(problem: Problem, shape: dict) -> tuple[torch.nn.Module, list]:
    """The reference and its inputs at a shape, on the meta device (a full KernelBench size costs no
    memory there)."""
    init = problem.init_inputs(shape)
    torch.manual_seed(1234)
    with torch.device("meta"):
        ref = in_mode(problem.module.Model(*init), problem.eval_mode)
    return ref, problem.inputs(shape, 0, "meta")


def graph_on_meta(problem: Problem, shape: dict) -> Graph | None:
    """The reference's graph at a shape, on the meta device; None where it cannot be captured there."""
    try:
        return capture(*_on_meta(problem, shape))
    except Exception:
        return None


def ops_on_meta(problem: Problem, shape: dict) -> list[dict]:
    """The reference's ops at a shape, traced on the meta device only (a full KernelBench size costs no
    memory there); [] where the model or its forward needs real values or the host."""
    try:
        return record_calls(*_on_meta(problem, shape))
    except Exception:
        return []


def _default_text(value: Any) -> str:
    """A default as source a candidate module can hold: its repr where that reads back as the value (a
    number, a string, a tuple), a torch dtype by name; else None (a default only an object of the
    problem's could give)."""
    text = repr(value)
    if isinstance(value, torch.dtype):
        return text
    try:
        same = ast.literal_eval(text) == value and type(ast.literal_eval(text)) is type(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        same = False
    return text if same else "None"


def parameter_texts(fn: Any) -> list[str]:
    """A method's parameters after `self` as source, one string each: names, defaults and kinds (`/`,
    `*`, `*args`, `**kwargs`) as declared, without annotations (names a candidate's module may not
    import). A template's ModelNew declares them so, and builds as Model does from any call."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    out: list[str] = []
    starred = False
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not starred:
            out.append("*")
            starred = True
        if p.kind is p.VAR_POSITIONAL:
            out.append(f"*{p.name}")
            starred = True
        elif p.kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}")
        elif p.default is p.empty:
            out.append(p.name)
        else:
            out.append(f"{p.name}={_default_text(p.default)}")
        if p.kind is p.POSITIONAL_ONLY and (
            i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY
        ):
            out.append("/")
    return out
