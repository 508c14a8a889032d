"""Graph rewriting the composed families and the composer share: a node's arguments carried into a graph
being built with their references renumbered, a graph pruned to what its outputs need, a graph's nodes
put in another order. Plain data in, plain data out, like core/graph."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

from kernelbrain.core.graph import Graph, Node

Where = dict[tuple[int, int], list[int]]  # a value of the old graph -> [node, output] of the new one


def moved(graph: Graph, value: Any, where: Where) -> Any:
    """A node argument of `graph` with every reference in it (in lists too) renumbered by `where`."""
    if isinstance(value, list):
        return [moved(graph, v, where) for v in value]
    ref = graph.ref(value)
    return {"ref": where[ref]} if ref is not None else value


def carried(graph: Graph, node: Node, where: Where) -> Node:
    """A node of `graph` as another graph holds it: its references renumbered by `where`."""
    return Node(op=node.op, args={k: moved(graph, v, where) for k, v in node.args.items()}, outs=node.outs)


def renumbered(graph: Graph, order: list[int]) -> Graph:
    """The graph of the nodes `order` names, in that order, references renumbered (each node `order` keeps
    must find what it reads kept too); its sized numbers follow their nodes, those of dropped ones drop."""
    at = {old: new for new, old in enumerate(order)}
    where = {(old, k): [new, k] for old, new in at.items() for k in range(len(graph.nodes[old].outs))}
    nodes = [carried(graph, graph.nodes[i], where) for i in order]
    sized = [s.model_copy(update={"node": at[s.node]}) for s in graph.sized if s.node in at]
    outputs = [[at[o[0]], o[1]] for o in graph.outputs]
    return Graph(nodes=nodes, outputs=outputs, constants=graph.constants, sized=sized)


def readers(graph: Graph, at: int, of: Collection[tuple[int, int]]) -> Iterator[tuple[int, Node, list]]:
    """The nodes after node `at` that the outputs need and that read a value in `of` (as it stands when
    each is reached: the caller may add to it), each with its index and the values of `of` it reads."""
    wanted = graph.needed()
    for j in range(at + 1, len(graph.nodes)):
        n = graph.nodes[j]
        if any((j, k) in wanted for k in range(len(n.outs))):
            mine = [r for v in n.args.values() for r in graph.refs(v) if r in of]
            if mine:
                yield j, n, mine
