"""The reference's ATen graph: every op its forward dispatched, in order, with each tensor argument a
reference to the node that made it. Traced once by the child's analysis (kernelbrain/child/graph.py) on
the meta device, recorded in `ProblemAnalysed.graph`, and read by the generators that compose kernels
from it (kernelbrain/templates/pointwise.py): plain data, no torch.

An argument is a JSON value: a number, bool, string (a dtype as "float32") or None as the call had it
(defaults filled from the op's schema, so `elu(x)` reads alpha = 1); a tensor as `{"ref": [node, out]}`;
a list of them as a list.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pydantic import BaseModel

INPUT = "input"  # a forward argument: args {"index": position}
PARAM = "param"  # a parameter or buffer of the model: args {"name": its state-dict name}
# ops that draw random numbers (dropout in training mode): no kernel can match their outputs exactly
RANDOM_OPS = frozenset(
    {
        "aten.bernoulli_.float",
        "aten.bernoulli.default",
        "aten.bernoulli.p",
        "aten.native_dropout.default",
        "aten.rand_like.default",
        "aten.randn_like.default",
        "aten.uniform_.default",
        "aten.normal_.default",
        "aten.exponential_.default",
        "aten.random_.default",
        "aten.random_.from",
        "aten.random_.to",
        "aten.rand.default",
        "aten.randn.default",
        "aten.randint.default",
        "aten.randint.low",
        "aten.randperm.default",
        "aten.rrelu_with_noise.default",
        "aten.multinomial.default",
    }
)


class Meta(BaseModel):
    """A tensor's shape, strides and dtype ("float32", "bool", ...)."""

    shape: list[int]
    strides: list[int]
    dtype: str


class Node(BaseModel):
    op: str  # INPUT, PARAM, or the ATen overload's name: "aten.mul.Tensor"
    args: dict[str, Any]  # by the schema's argument names
    outs: list[Meta]  # one per tensor it returned (a tuple's in order)


class Sized(BaseModel):
    """A number in a node's arguments that the reference computed from a size (`x.size(0)` in a
    division): the product of forward input `input`'s axes [start, end), plus `offset`. `input` -1: it
    changed with the shape in no way found (a family must not keep it as a constant)."""

    node: int
    arg: str
    input: int
    start: int = 0
    end: int = 0
    offset: int = 0


class Graph(BaseModel):
    nodes: list[Node]
    outputs: list[list[int]]  # forward's tensor results, as [node, out]
    # forward arguments that are not tensors, by position (they are constants of the trace)
    constants: dict[int, Any] = {}
    # the numbers that differed when the reference was traced at a second shape (empty: none, or traced
    # at one shape only)
    sized: list[Sized] = []

    def ref(self, value: Any) -> tuple[int, int] | None:
        """The [node, out] an argument refers to, or None for a literal."""
        if isinstance(value, dict) and isinstance(value.get("ref"), list) and len(value["ref"]) == 2:
            return int(value["ref"][0]), int(value["ref"][1])
        return None

    def refs(self, value: Any) -> list[tuple[int, int]]:
        """The [node, out]s an argument refers to: one tensor's, or a list's (`cat`'s tensors)."""
        values = value if isinstance(value, list) else [value]
        return [r for v in values if (r := self.ref(v)) is not None]

    def meta(self, ref: tuple[int, int]) -> Meta:
        return self.nodes[ref[0]].outs[ref[1]]

    def ops(self) -> list[str]:
        """The distinct ATen ops, in first-use order (inputs and parameters left out)."""
        return list(dict.fromkeys(n.op for n in self.nodes if n.op not in {INPUT, PARAM}))

    def needed(self) -> set[tuple[int, int]]:
        """Every [node, out] the outputs depend on (they included)."""
        wanted = {(int(o[0]), int(o[1])) for o in self.outputs}
        outs: dict[int, set[int]] = {}  # the wanted outs by node, to test a node at once
        for n, k in wanted:
            outs.setdefault(n, set()).add(k)
        for j in range(len(self.nodes) - 1, -1, -1):
            node = self.nodes[j]
            if any(k < len(node.outs) for k in outs.get(j, ())):
                for value in node.args.values():
                    for n, k in self.refs(value):
                        wanted.add((n, k))
                        outs.setdefault(n, set()).add(k)
        return wanted

    def unsized(self, allowed: Collection[tuple[int, str]] = ()) -> None:
        """Raise ValueError naming the first size-computed number the outputs depend on, outside
        `allowed` ((node, arg) pairs the caller computes from the sizes itself)."""
        needed = {n for n, _ in self.needed()}
        for s in self.sized:
            if s.node in needed and (s.node, s.arg) not in allowed:
                raise ValueError(f"{self.nodes[s.node].op}'s {s.arg}, a number computed from a size")
