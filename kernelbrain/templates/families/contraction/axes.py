"""The contraction family's reading of the graph: an operand followed through its views (view, reshape,
transpose, permute, squeeze, expand) back to a source tensor as axes of atoms (source dims), the batch
axes of two operands cut where both align, and the order in which the kernel indexes an operand's dims.
NotContraction names what cannot be read."""

from __future__ import annotations

import math
from typing import Any

from kernelbrain.core.graph import INPUT, PARAM, Graph, Node
from kernelbrain.templates.base import FLOATS, Refusal

REGROUPS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}
SAME = {"aten.clone.default", "aten.contiguous.default", "aten.alias.default", "aten.detach.default",
         "aten.lift_fresh.default"}  # fmt: skip
PERMUTES = {"aten.t.default", "aten.transpose.int", "aten.permute.default"}
SQUEEZES = {"aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default"}
VIEWS = REGROUPS | SAME | PERMUTES | SQUEEZES | {"aten.expand.default"}

Atom = tuple[int, int]  # (source node, dim); (-1, size): a broadcast
Axes = list[tuple[Atom, ...]]  # each axis: the atoms it merges, in row-major order (none: size 1)


class NotContraction(Refusal):
    """What the graph holds that this family cannot compose (named in the refusal)."""


class Atoms:
    """Sizes of atoms, from the sources' traced shapes."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def size(self, atom: Atom) -> int:
        return atom[1] if atom[0] < 0 else self.graph.nodes[atom[0]].outs[0].shape[atom[1]]

    def axis(self, axis: tuple[Atom, ...]) -> int:
        return math.prod(self.size(a) for a in axis)


def axis_index(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def regroup(sizes: Atoms, axes: Axes, shape: list[int], op: str) -> Axes:
    """A view's axes: the atoms in row-major order cut into runs of the view's sizes (an atom of size 1
    dropped: it changes no element's place); NotContraction where a size would split an atom."""
    atoms = [a for axis in axes for a in axis if sizes.size(a) != 1]
    out: Axes = []
    at = 0
    for want in shape:
        run: list[Atom] = []
        while math.prod(sizes.size(a) for a in run) < want and at < len(atoms):
            run.append(atoms[at])
            at += 1
        if math.prod(sizes.size(a) for a in run) != want:
            raise NotContraction(f"{op} splitting a dim")
        out.append(tuple(run))
    if at != len(atoms):
        raise NotContraction(f"{op} splitting a dim")
    return out


def view_axes(sizes: Atoms, node: Node, axes: Axes) -> Axes:
    """The axes of a view op's result from its input's."""
    op, a, rank = node.op, node.args, len(axes)
    if op in SAME:
        return axes
    if op in REGROUPS:
        return regroup(sizes, axes, node.outs[0].shape, op)
    if op == "aten.t.default":
        return axes[::-1]
    if op == "aten.transpose.int":
        d0, d1 = axis_index(int(a["dim0"]), rank), axis_index(int(a["dim1"]), rank)
        out = list(axes)
        out[d0], out[d1] = axes[d1], axes[d0]
        return out
    if op == "aten.permute.default":
        return [axes[axis_index(int(d), rank)] for d in a["dims"]]
    if op == "aten.unsqueeze.default":
        out = list(axes)
        out.insert(axis_index(int(a["dim"]), rank + 1), ())
        return out
    if op in SQUEEZES:  # squeeze: the axes of size 1 among those named go
        dims = a.get("dim", a.get("dims"))
        named = (
            range(rank)
            if dims is None
            else [axis_index(int(d), rank) for d in ([dims] if isinstance(dims, int) else dims)]
        )
        return [ax for i, ax in enumerate(axes) if not (i in named and sizes.axis(ax) == 1)]
    if op == "aten.expand.default":
        shape = [int(s) for s in a["size"]]
        new = len(shape) - rank
        out = [((-1, s),) if s > 1 else () for s in shape[:new]]
        for ax, s in zip(axes, shape[new:], strict=True):
            out.append(ax if s in (-1, sizes.axis(ax)) else ((-1, s),))
        return out
    raise NotContraction(op)


def operand_axes(graph: Graph, sizes: Atoms, value: Any, sources: dict[int, int]) -> Axes:
    """The axes of a contraction's operand, followed through its views back to a forward input or a
    parameter (recorded in `sources`, node -> position)."""
    ref = graph.ref(value)
    if ref is None:
        raise NotContraction("an operand that is not a tensor")
    node = graph.nodes[ref[0]]
    if node.op in (INPUT, PARAM):
        if node.outs[0].dtype not in FLOATS:
            raise NotContraction(f"an operand of {node.outs[0].dtype}")
        sources.setdefault(ref[0], len(sources))
        return [((ref[0], d),) for d in range(len(node.outs[0].shape))]
    if node.op not in VIEWS:
        raise NotContraction(f"an operand produced by {node.op}")
    return view_axes(sizes, node, operand_axes(graph, sizes, node.args.get("self"), sources))


def batch_pieces(
    sizes: Atoms, a: tuple[Atom, ...], b: tuple[Atom, ...]
) -> list[tuple[tuple[Atom, ...], tuple[Atom, ...]]]:
    """The batch axis of both operands cut where both have an atom boundary: each piece a run of source
    dims on each side, or one broadcast atom on one side."""
    out: list[tuple[tuple[Atom, ...], tuple[Atom, ...]]] = []
    i = j = 0
    while i < len(a) or j < len(b):
        ra: list[Atom] = []
        rb: list[Atom] = []
        while True:
            pa = math.prod(sizes.size(x) for x in ra)
            pb = math.prod(sizes.size(x) for x in rb)
            if ra and rb and pa == pb:
                break
            if (pa <= pb or j == len(b)) and i < len(a):
                ra.append(a[i])
                i += 1
            elif j < len(b):
                rb.append(b[j])
                j += 1
            else:
                raise NotContraction("batch dims of the operands that do not align")
        for run in (ra, rb):
            if any(x[0] < 0 for x in run) and len(run) > 1:
                raise NotContraction("a batch broadcast that does not align with the other operand's dims")
        if ra[0][0] < 0 and rb[0][0] < 0:
            raise NotContraction("a batch dim both operands broadcast")
        out.append((tuple(ra), tuple(rb)))
    return out


def operand_plan(
    atoms: list[tuple[Atom, ...] | None], sources: dict[int, int], rank: dict[int, int]
) -> list[Any]:
    """(source, order, groups) for contraction_parts._operand: the source dims in the order the logical
    dims take them (the rest, of size 1, after them), each logical dim's dims or None (broadcast)."""
    src = next(a[0] for run in atoms if run for a in run if a[0] >= 0)
    groups = [None if run and run[0][0] < 0 else [d for s, d in run if s == src] for run in atoms]
    if any(s not in (src, -1) for run in atoms if run for s, _ in run):
        raise NotContraction("an operand made of two tensors")
    used = [d for g in groups if g for d in g]
    order = used + [d for d in range(rank[src]) if d not in used]
    return [sources[src], order, groups]
