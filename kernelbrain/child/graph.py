"""The reference's ATen graph (kernelbrain/core/graph.py), captured by a dispatch mode: it sees the ATen
op whatever Python name reached it (`F.relu`, `torch.relu`, `x.relu()` are all `aten.relu.default`)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kernelbrain.child.guard import dynamo_free
from kernelbrain.core.graph import INPUT, PARAM, Graph, Meta, Node, Sized


def _meta(t: torch.Tensor) -> Meta:
    return Meta(shape=list(t.shape), strides=list(t.stride()), dtype=str(t.dtype).removeprefix("torch."))


@dynamo_free
class _Capture(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[Node] = []
        self.made: dict[int, tuple[int, int]] = {}  # id(tensor) -> [node, out]
        self.alive: list[torch.Tensor] = []  # held so that no id is reused while the graph is made

    def add(self, op: str, args: dict[str, Any], outs: list[torch.Tensor]) -> None:
        self.nodes.append(Node(op=op, args=args, outs=[_meta(t) for t in outs]))
        for k, t in enumerate(outs):
            self.made[id(t)] = (len(self.nodes) - 1, k)
            self.alive.append(t)

    def encode(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            ref = self.made.get(id(value))
            # a tensor the graph did not make: an attribute that is neither parameter nor buffer
            return {"ref": list(ref)} if ref is not None else {"tensor": _meta(value).model_dump()}
        if isinstance(value, list | tuple):
            return [self.encode(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return {"float": repr(value)}  # JSON has no inf or nan
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, torch.dtype):
            return str(value).removeprefix("torch.")
        return {"object": str(value)}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        bound: dict[str, Any] = {}
        positional = iter(args)
        for arg in func._schema.arguments:
            if not arg.kwarg_only and (value := next(positional, _MISSING)) is not _MISSING:
                bound[arg.name] = value
            elif arg.name in kwargs:
                bound[arg.name] = kwargs[arg.name]
            elif arg.has_default_value():
                bound[arg.name] = arg.default_value
        encoded = {name: self.encode(v) for name, v in bound.items()}
        self.add(str(func), encoded, [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        return out


_MISSING = object()


def capture(model: torch.nn.Module, inputs: list) -> Graph:
    """The graph of one forward call on `inputs` (meta tensors cost nothing)."""
    mode = _Capture()
    constants: dict[int, Any] = {}
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            mode.add(INPUT, {"index": i}, [x])
        else:
            constants[i] = mode.encode(x)
    for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        mode.add(PARAM, {"name": name}, [t])
    with torch.no_grad(), mode:
        result = model(*inputs)
    outputs = [mode.made.get(id(t)) for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
    if any(o is None for o in outputs):
        raise ValueError("forward returned a tensor its graph did not make")
    return Graph(nodes=mode.nodes, outputs=[list(o) for o in outputs if o], constants=constants)


def _input_shapes(graph: Graph) -> dict[int, list[int]]:
    return {int(n.args["index"]): n.outs[0].shape for n in graph.nodes if n.op == INPUT}


def _explain(value: float, other: float, shapes: dict[int, list[int]], others: dict[int, list[int]]) -> dict:
    """The product of one input's consecutive axes, plus a small offset, that is `value` at the first
    shape and `other` at the second; {"input": -1} where none is."""
    for index, shape in shapes.items():
        alt = others.get(index)
        if alt is None or len(alt) != len(shape):
            continue
        for start in range(len(shape)):
            for end in range(start + 1, len(shape) + 1):
                here, there = math.prod(shape[start:end]), math.prod(alt[start:end])
                offset = value - here
                if offset == other - there and float(offset).is_integer() and abs(offset) <= 2:
                    return {"input": index, "start": start, "end": end, "offset": int(offset)}
    return {"input": -1}


def mark_sized(graph: Graph, other: Graph) -> Graph:
    """`graph` with the numbers that differ in `other` (the same reference traced at another shape)
    recorded in `Graph.sized`; unchanged where the two traces ran different ops."""
    if [n.op for n in graph.nodes] != [n.op for n in other.nodes]:
        return graph
    shapes, others = _input_shapes(graph), _input_shapes(other)
    sized = []
    for i, (a, b) in enumerate(zip(graph.nodes, other.nodes, strict=True)):
        for key, value in a.args.items():
            alt = b.args.get(key)
            numbers = isinstance(value, int | float) and isinstance(alt, int | float)
            if numbers and not isinstance(value, bool) and value != alt:
                sized.append(Sized(node=i, arg=key, **_explain(value, alt, shapes, others)))
    return graph.model_copy(update={"sized": sized})
