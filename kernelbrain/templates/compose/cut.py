"""Cutting a traced graph into stages: where a compute-bound head's chain (its views and same-shape
elementwise ops) ends (`split`), and the graph after a cut as a stage graph of its own (`tail_graph`):
its INPUT 0 the value it starts from, its further inputs the forward inputs and parameters it reads
(`sources`: ["input", position], ["param", state-dict name], or what the caller names, like a torch
head's values). Nothing here picks a family: stages.py composes what this cuts."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from kernelbrain.core.graph import INPUT, PARAM, Graph, Meta, Node
from kernelbrain.templates.base import Refusal
from kernelbrain.templates.families import moments, pointwise
from kernelbrain.templates.rewrite import Where, carried, readers, renumbered

Value = tuple[int, int]


class NotTail(Refusal):
    """What a stage holds that no memory-bound family composes (named in the refusal)."""


def elementwise(op: str) -> bool:
    """An op pointwise composes (its in-place form too)."""
    return op in pointwise.EXPRESSIONS or op.replace("_.", ".", 1) in pointwise.EXPRESSIONS


def split(
    graph: Graph, at: int, views: Collection[str], trailing: int = 0
) -> tuple[Value, Graph, dict[str, Any]] | None:
    """Where the chain after node `at` (its views and same-shape elementwise ops) ends: None where it
    reaches the output; else (h, the head graph with h as its output, the tail: {"graph", "sources",
    "counted"}, sources naming the tail's inputs 1.. as ["input", position] or ["param", state-dict
    name]; counted the batch counters the whole graph increments). The chain's last `trailing` views that
    no elementwise op of it reads are the tail's."""
    reached = {(at, k) for k in range(len(graph.nodes[at].outs))}
    cut = None
    for j, n, mine in readers(graph, at, reached):
        same = n.outs[0].shape == graph.meta(mine[0]).shape
        if n.op in views or (elementwise(n.op) and same):
            reached |= {(j, k) for k in range(len(n.outs))}
            continue
        cut = j
        break
    if cut is None or tuple(graph.outputs[0]) in reached:
        return None
    reached = _without_trailing_views(graph, reached, at, views, trailing)
    try:
        h, head, rest = cut_after(graph, reached, graph.nodes[at].op)
    except NotTail:  # the tail reads several values of the chain: cut it at one they all derive from
        h, head, rest = _earlier(graph, reached, graph.nodes[at].op)
    return h, head, {**rest, "counted": moments.counters(graph)}


def _without_trailing_views(
    graph: Graph, reached: set[Value], at: int, views: Collection[str], count: int
) -> set[Value]:
    """The chain's values less its last `count` views that no op of the chain but such a view reads."""
    kept: set[Value] = set()
    read: set[Value] = set()
    for value in sorted(reached, reverse=True):
        node = graph.nodes[value[0]]
        if value[0] != at and node.op in views and value not in read and count > 0:
            count -= 1
            continue
        kept.add(value)
        read |= {r for v in node.args.values() for r in graph.refs(v)}
    return kept


def _earlier(graph: Graph, reached: set[Value], head: str) -> tuple[Value, Graph, dict[str, Any]]:
    """The chain cut at its latest value h that every value the tail reads derives from (the tail
    computing the rest of the chain again from h), as `cut_after` gives it."""
    for value in sorted(reached, reverse=True):
        before = Graph(nodes=graph.nodes, outputs=[list(value)]).needed() & reached
        try:
            h, cut_head, rest = cut_after(graph, before, head)
        except NotTail:
            continue
        if h == value:
            return h, cut_head, rest
    return cut_after(graph, reached, head)  # raises NotTail naming how many values the tail reads


def cut_after(graph: Graph, reached: set[Value], head: str) -> tuple[Value, Graph, dict[str, Any]]:
    """The graph cut after the values `reached`: (h, the one of them the rest reads, the head graph with
    h as its output, the rest over h as `tail_graph` gives it). `head` names what precedes the cut in
    the refusal where the rest reads more than one value."""
    # the rest: every node the output needs that the chain did not make, h a leaf
    wanted = {tuple(o) for o in graph.outputs}
    read: set[Value] = set()
    keep: list[int] = []
    for j in range(len(graph.nodes) - 1, -1, -1):
        outs = [(j, k) for k in range(len(graph.nodes[j].outs))]
        if not any(r in wanted for r in outs):
            continue
        if any(r in reached for r in outs):
            read |= {r for r in outs if r in wanted}
            continue
        keep.append(j)
        for value in graph.nodes[j].args.values():
            wanted.update(graph.refs(value))
    if len(read) != 1:
        raise NotTail(f"a tail reading {len(read)} values of the chain after {head}")
    (h,) = read
    cut_head = Graph(nodes=graph.nodes, outputs=[list(h)], constants=graph.constants, sized=graph.sized)
    return h, cut_head, tail_graph(graph, h, sorted(keep))


def tail_graph(
    graph: Graph, h: Value, keep: list[int], also: Iterable[tuple[Value, list[Any]]] = ()
) -> dict[str, Any]:
    """{"graph", "sources"}: the nodes `keep` of `graph` renumbered into a stage graph whose INPUT 0 is h,
    each value of `also` (with the source that names it) an INPUT after it, then each forward input or
    parameter it reads (a forward input whose size a kept node computed a number from, too: a family
    reads it from its shape)."""
    nodes = [Node(op=INPUT, args={"index": 0}, outs=[graph.meta(h)])]
    where: Where = {h: [0, 0]}
    sources: list[list[Any]] = []
    by_source: dict[str, int] = {}

    def source(key: list[Any], meta: Meta) -> int:
        if repr(key) not in by_source:
            sources.append(key)
            nodes.append(Node(op=INPUT, args={"index": len(sources)}, outs=[meta]))
            by_source[repr(key)] = len(nodes) - 1
        return by_source[repr(key)]

    for value, key in also:
        where[value] = [source(key, graph.meta(value)), 0]
    for j in keep:
        n = graph.nodes[j]
        if n.op in (INPUT, PARAM):
            key = ["input", int(n.args["index"])] if n.op == INPUT else ["param", str(n.args["name"])]
            where[(j, 0)] = [source(key, n.outs[0]), 0]
            continue
        nodes.append(carried(graph, n, where))
        for k in range(len(n.outs)):
            where[(j, k)] = [len(nodes) - 1, k]
    sized = []
    for s in graph.sized:
        if (s.node, 0) not in where or nodes[where[(s.node, 0)][0]].op == INPUT:
            continue  # a number of a node the stage reads as an input (h, a forward input, a parameter)
        index = -1
        if s.input >= 0:
            meta = next(n.outs[0] for n in graph.nodes if n.op == INPUT and n.args["index"] == s.input)
            index = nodes[source(["input", s.input], meta)].args["index"]
        sized.append(s.model_copy(update={"node": where[(s.node, 0)][0], "input": index}))
    outputs = [where[tuple(o)] for o in graph.outputs]
    stage = Graph(nodes=nodes, outputs=outputs, constants=graph.constants, sized=sized)
    return {"graph": stage, "sources": sources}


def made(graph: Graph, value: Value) -> set[Value]:
    """The values an op of the graph makes that `value` needs (it included)."""
    head = Graph(nodes=graph.nodes, outputs=[list(value)])
    return {r for r in head.needed() if graph.nodes[r[0]].op not in (INPUT, PARAM)}


def ends(graph: Graph) -> list[Value]:
    """The values a first segment of a stage may end at, the latest first: each value the output needs
    that an op of the graph makes, the output itself left out."""
    needed = graph.needed() - {tuple(graph.outputs[0])}
    return sorted((r for r in needed if graph.nodes[r[0]].op not in (INPUT, PARAM)), reverse=True)


def pruned(graph: Graph) -> Graph:
    """The graph with only the nodes its outputs need (and its inputs), renumbered (a family counts every
    node's op)."""
    keep = sorted({n for n, _ in graph.needed()} | {i for i, n in enumerate(graph.nodes) if n.op == INPUT})
    return renumbered(graph, keep)
