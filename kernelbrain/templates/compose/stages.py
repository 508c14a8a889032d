"""Composing the stages around a compute-bound head from the memory-bound families, which run as further
launches in the same candidate:

    x' = prelude(x, t1, ...)              what makes the head's input where no forward input is it
    h = chain(head(x', ...))              the head (conv, conv_transpose, contraction, or torch ops)
    y = tail(h, t1, t2, ...)              reduce, normalize, staged, moments, layernorm, pool or pointwise

`with_stages` cuts a head family's graph (cut.split): the head graph, handed to the family, and the
tail (a graph whose INPUT 0 is h); where the tail cannot start from h viewed as the chain's trailing
views leave it, those views are tried as the tail's own first ops (`head_and_tail`). Where the head's
input is no forward input (a pooling before a convolution), what makes it is its prelude (`prelude`):
its INPUT 0 a forward input, its value the head's input. `compose` gives a stage graph to the first
family of FAMILIES that takes it, with that family's first feasible round-0 knob set; else to one of
STAGES (moments: a batch, group or instance norm, its parameters read by name, in training mode its
running statistics and batch count updated; layernorm; pool; pointwise; and conv: a convolution with
its chain, the one compute-bound stage); else it makes a chain of launches: a first segment (the graph
up to the latest value one family takes whole, the rest reading only that value of it) and the rest
composed the same way. A later launch may read h again, or any earlier launch's value, by a source
["value", k]. A softmax or log-softmax over any dim is a logsumexp kept over that dim and its map
(`expanded`; over a run of dims where a view flattens them and views back undo it): the normalize
family's. An op that draws random numbers (dropout in training mode) is refused by name: no kernel
matches it exactly. The stage is a dict {"family", "spec", "knobs", "sources", "then"}.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from kernelbrain.core.graph import INPUT, PARAM, RANDOM_OPS, Graph, Meta, Node
from kernelbrain.templates.base import Refusal
from kernelbrain.templates.compose import cut
from kernelbrain.templates.compose.cut import NotTail
from kernelbrain.templates.families import conv as conv_stage
from kernelbrain.templates.families import layernorm, moments, normalize, pointwise, pool, reduce, staged
from kernelbrain.templates.render import knob_text
from kernelbrain.templates.rewrite import Where, moved

# the memory-bound families a stage may be, in the order they are tried
FAMILIES = (reduce, normalize, staged)
# families a stage (or a segment of it) may be when none of FAMILIES takes it whole, in the order tried
STAGES = (moments, layernorm, pool, pointwise)
VALUE = "value"  # a source ["value", k]: the k-th value of a stage's chain of launches (0: h)

# views a tail may hold (the families it goes to take those they can, and name the others)
VIEW_OPS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default"}
VIEW_OPS |= pointwise.DIM_VIEWS.keys() | pointwise.PASS_THROUGH
_STAGE_OPS = reduce.REDUCTIONS | moments.NORMS | {layernorm.NORM} | pool.POOLS.keys() | conv_stage.CONVS
# softmax and log-softmax: a logsumexp kept per row, then the map x - lse (exp of it for softmax)
SOFTMAX = {
    "aten._softmax.default": True,
    "aten.softmax.int": True,
    "aten._log_softmax.default": False,
    "aten.log_softmax.int": False,
}
_RESHAPES = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}


def with_stages(family: Any, graph: Graph) -> dict[str, Any]:
    """A head family's spec of the graph (base.Head): the head cut out (its op `family.head` finds and the
    chain after it) and composed by the family, beside it "ops" (the whole graph's), "tail" and
    "prelude" (stages composed here, or None). Raises the family's refusal."""
    at = family.head(graph)
    ops = graph.ops()
    try:  # what is not elementwise after the chain: the tail, further launches over the chain's value
        graph, rest = head_and_tail(graph, at, family.CHAIN, family.HEAD)
        before = None
        if family.INPUT_ARG is not None:  # launches that make the input, where no forward input is it
            value = graph.nodes[at].args[family.INPUT_ARG]
            graph, _, before = input_prelude(graph, value, family.CHAIN, family.HEAD)
    except NotTail as e:
        raise family.REFUSAL(str(e)) from None
    return {**family.compose(graph), "ops": ops, "tail": rest, "prelude": before}


def head_and_tail(
    graph: Graph, at: int, views: Collection[str], head: str
) -> tuple[Graph, dict[str, Any] | None]:
    """The head graph (the op at `at` and its chain, as `split` cuts it) and its tail composed (None
    where the chain reaches the output). Where the tail cannot be composed from h viewed as the chain's
    trailing views leave it, those views are tried as the tail's first ops, the latest first, one more
    at a time (an instance norm's unsqueezes and view before it, undone after it: moments takes them
    whole; a softmax over dims a view flattens). Raises NotTail (the first refusal)."""
    found = cut.split(graph, at, views)
    if found is None:
        return graph, None
    try:
        return found[1], compose(found[2], head, views)
    except NotTail as e:
        refused, h = e, found[0]
    trailing = 0
    while True:
        trailing += 1
        found = cut.split(graph, at, views, trailing)
        if found is None or found[0] == h:
            raise refused
        h = found[0]
        try:
            return found[1], compose(found[2], head, views)
        except NotTail:
            continue


def prelude(
    graph: Graph, value: tuple[int, int], views: Collection[str], head: str
) -> tuple[Graph, dict[str, Any]]:
    """The launches that make `value`, an operand of a compute-bound op that no forward input is (a
    pooling of one), composed as a tail is: its INPUT 0 the first forward input it reads ("input": that
    input's position), its sources forward's other tensors and parameters. With it, the graph in which
    `value` is an INPUT of its own ("at": its index, past forward's), which the op reads as it would a
    forward input (render.reading names it). Raises NotTail."""
    if value[1] != 0:
        raise NotTail(f"{graph.nodes[value[0]].op}'s second result before the {head}")
    making = Graph(nodes=graph.nodes, outputs=[list(value)], constants=graph.constants, sized=graph.sized)
    needed = sorted({n for n, _ in making.needed()})
    first = next((n for n in needed if graph.nodes[n].op == INPUT), None)
    if first is None:
        raise NotTail(f"{graph.nodes[value[0]].op} of no forward input before the {head}")
    before = cut.tail_graph(making, (first, 0), [n for n in needed if n != first])
    composed = compose({**before, "counted": moments.counters(graph)}, head, views, "before")
    at = 1 + max(int(n.args["index"]) for n in graph.nodes if n.op == INPUT)
    nodes = list(graph.nodes)
    nodes[value[0]] = Node(op=INPUT, args={"index": at}, outs=[graph.meta(value)])
    sized = [s for s in graph.sized if s.node != value[0]]
    replaced = Graph(nodes=nodes, outputs=graph.outputs, constants=graph.constants, sized=sized)
    return replaced, {**composed, "input": int(graph.nodes[first].args["index"]), "at": at}


def input_prelude(
    graph: Graph, value: Any, views: Collection[str], head: str
) -> tuple[Graph, tuple[int, int] | None, dict[str, Any] | None]:
    """A compute-bound op's input `value` followed back through pass-through views to what makes it:
    (the graph, that source, None) where a forward input or a parameter does, else the source made an
    INPUT of the graph by `prelude`, with the prelude's launches. Raises NotTail."""
    src = pointwise.through(graph, graph.ref(value))
    if src is None or graph.nodes[src[0]].op in (INPUT, PARAM):
        return graph, src, None
    graph, composed = prelude(graph, src, views, head)
    return graph, src, composed


def expanded(graph: Graph) -> Graph:
    """The graph with each softmax (log-softmax) over a dim as a logsumexp over that dim, kept, and the
    map exp(x - lse) (x - lse): a statistic and a map, which the normalize family composes. A softmax of
    a view that merges a run of dims into its dim, its value read only by views back to the unmerged
    shape (x.view(b, c, -1).softmax(2).view(b, c, d, h, w)), is one over that run of the unmerged value,
    those views dropped. Unchanged where it holds none."""
    if not any(n.op in SOFTMAX for n in graph.nodes):
        return graph
    nodes: list[Node] = []
    where: Where = {}
    undone: dict[int, list[int]] = {}  # a view back to the unmerged shape -> the map's value
    for i, node in enumerate(graph.nodes):
        if i in undone:
            where[(i, 0)] = undone[i]
            continue
        args = {k: moved(graph, v, where) for k, v in node.args.items()}
        if node.op not in SOFTMAX:
            nodes.append(Node(op=node.op, args=args, outs=node.outs))
            where |= {(i, k): [len(nodes) - 1, k] for k in range(len(node.outs))}
            continue
        if args.get("half_to_float") or args.get("dtype") not in (None, node.outs[0].dtype):
            raise NotTail(f"{node.op} to another dtype")
        x = graph.meta(graph.ref(node.args["self"]))
        dims, value, out = [int(args["dim"]) % max(len(x.shape), 1)], args["self"], node.outs[0]
        merged, readers = _merged(graph, i), []
        if merged is not None:
            source, dims, readers = merged
            value, x = {"ref": where[source]}, graph.meta(source)
            out = Meta(shape=x.shape, strides=[0] * len(x.shape), dtype=out.dtype)
        kept = [1 if d in dims else s for d, s in enumerate(x.shape)]
        lse = Meta(shape=kept, strides=[0] * len(kept), dtype=x.dtype)  # the kernel's own layout
        nodes.append(
            Node(op="aten.logsumexp.default", args={"self": value, "dim": dims, "keepdim": True}, outs=[lse])
        )
        shifted = {"self": value, "other": {"ref": [len(nodes) - 1, 0]}, "alpha": 1}
        nodes.append(Node(op="aten.sub.Tensor", args=shifted, outs=[out]))
        if SOFTMAX[node.op]:
            nodes.append(Node(op="aten.exp.default", args={"self": {"ref": [len(nodes) - 1, 0]}}, outs=[out]))
        where[(i, 0)] = [len(nodes) - 1, 0]
        undone |= {j: [len(nodes) - 1, 0] for j in readers}
    outputs = [where[(int(o[0]), int(o[1]))] for o in graph.outputs]
    sized = [
        s.model_copy(update={"node": where[(s.node, 0)][0]}) for s in graph.sized if s.node not in undone
    ]
    return Graph(nodes=nodes, outputs=outputs, constants=graph.constants, sized=sized)


def _merged(graph: Graph, at: int) -> tuple[tuple[int, int], list[int], list[int]] | None:
    """Where the softmax at `at` is over a view of a value s that merges a run of s's dims into the
    softmax's dim, and every reader of its value is a view back to s's shape: (s, that run of dims, the
    readers). None otherwise."""
    view = graph.ref(graph.nodes[at].args["self"])
    if view is None or graph.nodes[view[0]].op not in _RESHAPES:
        return None
    source = graph.ref(graph.nodes[view[0]].args["self"])
    if source is None:
        return None
    s, x = graph.meta(source).shape, graph.meta(view).shape
    dim = int(graph.nodes[at].args["dim"]) % max(len(x), 1)
    end = len(s) - (len(x) - dim - 1)  # the run is s[dim:end]
    if end <= dim or s[:dim] != x[:dim] or s[end:] != x[dim + 1 :] or math.prod(s[dim:end]) != x[dim]:
        return None
    readers = [
        j for j, n in enumerate(graph.nodes) if (at, 0) in {r for v in n.args.values() for r in graph.refs(v)}
    ]
    if any(tuple(o) == (at, 0) for o in graph.outputs) or not readers:
        return None
    if not all(graph.nodes[j].op in _RESHAPES and graph.nodes[j].outs[0].shape == s for j in readers):
        return None
    return source, list(range(dim, end)), readers


def _first_foreign(graph: Graph, views: Collection[str]) -> str | None:
    """The first op of the stage that is neither elementwise, a view, a reduction, a norm, a pooling nor
    a convolution (one that draws random numbers first: dropout in training mode)."""
    wanted = {n for n, _ in graph.needed()}
    random = next((n.op for i, n in enumerate(graph.nodes) if i in wanted and n.op in RANDOM_OPS), None)
    if random is not None:
        return f"{random} (random numbers: dropout in training mode)"
    for i, n in enumerate(graph.nodes):
        known = (
            cut.elementwise(n.op) or n.op in views or n.op in VIEW_OPS or n.op in _STAGE_OPS or n.op == INPUT
        )
        if i in wanted and not known:
            return n.op
    return None


def with_params(graph: Graph, sources: list[list[Any]]) -> Graph:
    """The stage graph with each INPUT that is a parameter or buffer (its source ["param", name]) a
    PARAM node of that name again: moments reads a norm's weights by name, and the stage's launch reads
    them from the one ModelNew (Model's constructor run in it) by `get_parameter`/`get_buffer`."""
    nodes = []
    for n in graph.nodes:
        index = int(n.args["index"]) if n.op == INPUT else 0
        if index > 0 and sources[index - 1][0] == "param":
            n = Node(op=PARAM, args={"name": sources[index - 1][1]}, outs=n.outs)
        nodes.append(n)
    return graph.model_copy(update={"nodes": nodes})


def _spec(family: Any, graph: Graph, sources: list[list[Any]]) -> dict[str, Any]:
    """The family's spec of a stage graph: a head family's where it needs no stages of its own."""
    if family is conv_stage:
        spec = with_stages(conv_stage, graph)
        if spec["tail"] or spec["prelude"]:  # a convolution's own launches: segments of this chain
            raise conv_stage.NotConv("launches of its own before or after it")
        return spec
    return family.compose(with_params(graph, sources) if family is moments else graph)


def _whole(
    graph: Graph, sources: list[list[Any]], families: tuple, why: list[str], counted: Collection[str] | None
) -> dict[str, Any] | None:
    """The stage as the first of `families` composes it at its first feasible round-0 knob set (what
    each refused, appended to `why`). A batch norm in training mode counts its batch in the counter of
    its module among `counted` (the whole graph's: the stage holds no add_ that nothing reads); None:
    not known, and such a norm is refused."""
    for family in families:
        try:
            spec = _spec(family, graph, sources)
        except Refusal as e:
            why.append(f"{family.FAMILY}: {e}")
            continue
        if family is moments and spec["mode"] == "batch" and spec["running"]:
            if counted is None:
                why.append("moments: a batch norm in training mode, its batch counter not known")
                continue
            module = spec["running"][0].rpartition(".")[0]
            counter = f"{module}.num_batches_tracked" if module else "num_batches_tracked"
            spec = {**spec, "count": counter if counter in counted else None}
        knobs = next((k for k in family.ROUND0 if family.feasible(spec, k)), None)
        if knobs is None:
            why.append(f"{family.FAMILY}: no feasible round-0 knob set")
            continue
        return {"family": family.FAMILY, "spec": spec, "knobs": knobs, "sources": sources, "then": None}
    return None


def _stages(graph: Graph) -> tuple:
    """The families of STAGES worth trying on the graph whole: the one of its convolution, norm or
    pooling, else pointwise where it holds no stage at all."""
    ops = {n.op for n in graph.nodes}
    if ops & conv_stage.CONVS:
        return (conv_stage,)
    if ops & moments.NORMS:
        return (moments,)
    if layernorm.NORM in ops:
        return (layernorm,)
    if ops & pool.POOLS.keys():
        return (pool,)
    return () if ops & _STAGE_OPS else (pointwise,)


def compose(
    tail: dict[str, Any], head: str, views: Collection[str] = (), place: str = "after"
) -> dict[str, Any]:
    """The stage ({"graph", "sources", "counted"} from cut.split; without "counted" a batch norm in
    training mode with running statistics is refused) as the first family of FAMILIES composes it, with
    the knobs it runs at; else as the first of STAGES does; else as a chain of launches ("then"): a
    first segment (the graph up to one value, as large as one family takes whole) and the rest over that
    value composed the same way. A later launch may read h again, or any value before it, besides
    forward's tensors: its sources name them ["value", k] (0: h, k: what launch k-1 made). A softmax is
    a logsumexp and a map (`expanded`). Raises NotTail naming the op no family takes (`head`: what
    precedes it; "before" as `place` for a prelude's)."""
    graph = expanded(tail["graph"])
    foreign = _first_foreign(graph, views)
    if foreign is not None:
        raise NotTail(f"{foreign} {place} the {head}")
    why: list[str] = []
    found = _compose(graph, tail["sources"], 0, tail.get("counted"), why)
    if found is None:
        raise NotTail(f"ops {place} the {head} no memory-bound family takes ({'; '.join(why)})")
    return found


def _compose(
    graph: Graph, sources: list[list[Any]], depth: int, counted: Collection[str] | None, why: list[str]
) -> dict[str, Any] | None:
    """`compose` over a graph whose INPUT 0 is the chain's value `depth`, its sources absolute (forward
    inputs, parameters, earlier values of the chain); None where nothing takes it (why appended)."""
    whole = _whole(graph, sources, FAMILIES + _stages(graph), why, counted)
    if whole is not None:
        return whole
    refused: list[str] = []
    for value in cut.ends(graph):
        try:
            read, _, rest = cut.cut_after(graph, cut.made(graph, value), "")
        except NotTail:
            continue  # the rest reads more than one value of what the head makes
        if read != value:
            continue
        first = cut.pruned(
            Graph(nodes=graph.nodes, outputs=[list(value)], constants=graph.constants, sized=graph.sized)
        )
        segment = _whole(first, sources, FAMILIES + _stages(first), [], counted)
        if segment is None:
            continue
        # the rest's inputs: the segment's value (INPUT 0), this graph's INPUT 0 (the chain's value
        # `depth`) and this graph's sources
        rest_sources = [
            [VALUE, depth] if s == ["input", 0] else sources[int(s[1]) - 1] for s in rest["sources"]
        ]
        then = _compose(rest["graph"], rest_sources, depth + 1, counted, refused)
        if then is not None:
            return {**segment, "then": then}
    if refused:
        why.append(f"in segments: {refused[0]}")
    return None


def feasible(stage: dict[str, Any]) -> bool:
    """Whether every launch of a stage fits at its knobs."""
    family = next(f for f in (*FAMILIES, *STAGES, conv_stage) if stage["family"] == f.FAMILY)
    fits = family.feasible(stage["spec"], stage["knobs"])
    return fits and (stage["then"] is None or feasible(stage["then"]))


def describe(stage: dict[str, Any]) -> str:
    """The stage's families and knobs, in launch order, for a candidate's docstring."""
    here = f"{stage['family']} ({knob_text(stage['knobs'])})"
    return here if stage["then"] is None else f"{here}, then {describe(stage['then'])}"
