"""The tail of a compute-bound op: what follows a contraction's (or a convolution's) fused pointwise
chain when that is not pointwise too (a row sum, a logsumexp, a softmax, x - max(x), a norm, a pooling,
several of them in sequence), composed by the memory-bound families that already exist and run as
further launches in the same candidate:

    h = chain(contraction(...))           the first kernel, h written once in its traced dtype
    y = tail(h, t1, t2, ...)              reduce, normalize, staged, moments, layernorm, pool or pointwise

`split` cuts the traced graph where the chain ends: the head (the graph with h as its output) and the
tail (a graph whose INPUT 0 is h, its further inputs the forward inputs and parameters it reads, and the
batch counters the whole graph increments). `head_and_tail` composes the tail, and where it cannot start
from h viewed as the chain's trailing views leave it, tries those views as the tail's own first ops.
`compose` gives the tail to the first family of FAMILIES that takes it, with that family's first
feasible round-0 knob set; else to one of STAGES (moments: a batch, group or instance norm, its
parameters read by name from the one ModelNew, in training mode its running statistics and batch count
updated; layernorm: a layer norm over the trailing dims, row_norm's kernels; pool; pointwise; and conv:
a convolution with its chain, the one compute-bound stage, imported where used); else it makes a chain
of launches: a first segment (the graph up to the latest value one family takes whole, the rest reading
only that value of it) and the rest composed the same way. A later launch may read h again (a residual
add of the head's value after a norm), or any earlier launch's value, by a source ["value", k]. A
softmax or log-softmax over any dim is a logsumexp kept over that dim and its map (`expanded`; over a
run of dims where a view flattens them and views back undo it): the normalize family's. `render_parts`
renders its kernels and chains with every top-level name suffixed (templates/render.renamed), so that
they sit beside the head's in one module; `call` writes the lines of forward that launch it. What makes
a compute-bound op's input where that is no forward input (a pooling before a convolution) is composed
the same way as its prelude (`prelude`): its INPUT 0 a forward input, its value the op's input, run
before it under the suffix PRE. An op that draws random numbers (dropout in training mode) is refused by
name: no kernel matches it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from kernelbrain.core.graph import INPUT, PARAM, Graph, Meta, Node
from kernelbrain.templates.base import Refusal
from kernelbrain.templates.compose.tail_render import SUFFIX as SUFFIX
from kernelbrain.templates.compose.tail_render import VALUE, NotTail, call
from kernelbrain.templates.compose.tail_render import render_parts as render_parts
from kernelbrain.templates.families import layernorm, moments, normalize, pointwise, pool, reduce, staged

# the memory-bound families a tail may be, in the order they are tried
FAMILIES = (reduce, normalize, staged)
# families a tail (or a segment of it) may be when none of FAMILIES takes it whole, in the order tried
STAGES = (moments, layernorm, pool, pointwise)
PRE = "_pre"  # the suffix of a prelude's parts


def _elementwise(op: str) -> bool:
    return op in pointwise.EXPRESSIONS or op.replace("_.", ".", 1) in pointwise.EXPRESSIONS


def head_and_tail(graph: Graph, at: int, views: Collection[str], after: str) -> tuple[Graph, dict | None]:
    """The head graph (the op at `at` and its chain, as `split` cuts it) and its tail composed (None
    where the chain reaches the output). Where the tail cannot be composed from h viewed as the chain's
    trailing views leave it, those views are tried as the tail's first ops, the latest first, one more
    at a time (an instance norm's unsqueezes and view before it, undone after it: moments takes them
    whole; a softmax over dims a view flattens). Raises NotTail (the first refusal)."""
    cut = split(graph, at, views)
    if cut is None:
        return graph, None
    try:
        return cut[1], compose(cut[2], after, views)
    except NotTail as e:
        refused, h = e, cut[0]
    moved = 0
    while True:
        moved += 1
        cut = split(graph, at, views, moved)
        if cut is None or cut[0] == h:
            raise refused
        h = cut[0]
        try:
            return cut[1], compose(cut[2], after, views)
        except NotTail:
            continue


def split(
    graph: Graph, at: int, views: Collection[str], trailing: int = 0
) -> tuple[tuple[int, int], Graph, dict] | None:
    """Where the chain after node `at` (its views and same-shape elementwise ops) ends: None where it
    reaches the output; else (h, the head graph with h as its output, the tail: {"graph", "sources"},
    sources naming the tail's inputs 1.. as ["input", position] or ["param", state-dict name]). The
    chain's last `trailing` views that no elementwise op of it reads are the tail's."""
    wanted = graph.needed()
    reached = {(at, k) for k in range(len(graph.nodes[at].outs))}
    cut = None
    for j in range(at + 1, len(graph.nodes)):
        n = graph.nodes[j]
        if not any((j, k) in wanted for k in range(len(n.outs))):
            continue
        mine = [r for v in n.args.values() for r in graph.refs(v) if r in reached]
        if not mine:
            continue
        same = n.outs[0].shape == graph.meta(mine[0]).shape
        if n.op in views or (_elementwise(n.op) and same):
            reached |= {(j, k) for k in range(len(n.outs))}
            continue
        cut = j
        break
    if cut is None or tuple(graph.outputs[0]) in reached:
        return None
    reached = _without_trailing_views(graph, reached, at, views, trailing)
    try:
        h, head, rest = _cut(graph, reached, graph.nodes[at].op)
    except NotTail:  # the tail reads several values of the chain: cut it at one they all derive from
        h, head, rest = _earlier(graph, reached, graph.nodes[at].op)
    return h, head, {**rest, "counted": moments.counters(graph)}


def _without_trailing_views(
    graph: Graph, reached: set[tuple[int, int]], at: int, views: Collection[str], count: int
) -> set[tuple[int, int]]:
    """The chain's values less its last `count` views that no op of the chain but such a view reads."""
    kept: set[tuple[int, int]] = set()
    read: set[tuple[int, int]] = set()
    for value in sorted(reached, reverse=True):
        node = graph.nodes[value[0]]
        if value[0] != at and node.op in views and value not in read and count > 0:
            count -= 1
            continue
        kept.add(value)
        read |= {r for v in node.args.values() for r in graph.refs(v)}
    return kept


def _earlier(graph: Graph, reached: set[tuple[int, int]], after: str) -> tuple[tuple[int, int], Graph, dict]:
    """The chain cut at its latest value h that every value the tail reads derives from (the tail
    computing the rest of the chain again from h), as `_cut` gives it."""
    for value in sorted(reached, reverse=True):
        before = Graph(nodes=graph.nodes, outputs=[list(value)]).needed() & reached
        try:
            h, head, rest = _cut(graph, before, after)
        except NotTail:
            continue
        if h == value:
            return h, head, rest
    return _cut(graph, reached, after)  # raises NotTail naming how many values the tail reads


def _cut(graph: Graph, reached: set[tuple[int, int]], after: str) -> tuple[tuple[int, int], Graph, dict]:
    """The graph cut after the values `reached`: (h, the one of them the rest reads, the head graph with
    h as its output, the tail over h as `split` gives it)."""
    # the tail: every node the output needs that the chain did not make, h a leaf
    tail_wanted = {tuple(o) for o in graph.outputs}
    read: set[tuple[int, int]] = set()
    keep: list[int] = []
    for j in range(len(graph.nodes) - 1, -1, -1):
        outs = [(j, k) for k in range(len(graph.nodes[j].outs))]
        if not any(r in tail_wanted for r in outs):
            continue
        if any(r in reached for r in outs):
            read |= {r for r in outs if r in tail_wanted}
            continue
        keep.append(j)
        for value in graph.nodes[j].args.values():
            tail_wanted.update(graph.refs(value))
    if len(read) != 1:
        raise NotTail(f"a tail reading {len(read)} values of the chain after {after}")
    (h,) = read
    head = Graph(nodes=graph.nodes, outputs=[list(h)], constants=graph.constants, sized=graph.sized)
    return h, head, _tail_graph(graph, h, sorted(keep))


def _tail_graph(graph: Graph, h: tuple[int, int], keep: list[int]) -> dict:
    """The tail's nodes renumbered: INPUT 0 is h, each forward input or parameter an INPUT after it (a
    forward input whose size a tail node computed a number from, too: a family reads it from its shape)."""
    nodes = [Node(op=INPUT, args={"index": 0}, outs=[graph.meta(h)])]
    where: dict[tuple[int, int], list[int]] = {h: [0, 0]}
    sources: list[list[Any]] = []
    by_source: dict[tuple[str, Any], int] = {}

    def source(kind: str, what: Any, meta: Meta) -> int:
        if (kind, what) not in by_source:
            sources.append([kind, what])
            nodes.append(Node(op=INPUT, args={"index": len(sources)}, outs=[meta]))
            by_source[(kind, what)] = len(nodes) - 1
        return by_source[(kind, what)]

    def moved(value: Any) -> Any:
        if isinstance(value, list):
            return [moved(v) for v in value]
        ref = graph.ref(value)
        return {"ref": where[ref]} if ref is not None else value

    for j in keep:
        n = graph.nodes[j]
        if n.op in (INPUT, PARAM):
            key = ("input", int(n.args["index"])) if n.op == INPUT else ("param", str(n.args["name"]))
            where[(j, 0)] = [source(*key, n.outs[0]), 0]
            continue
        nodes.append(Node(op=n.op, args={k: moved(v) for k, v in n.args.items()}, outs=n.outs))
        for k in range(len(n.outs)):
            where[(j, k)] = [len(nodes) - 1, k]
    sized = []
    for s in graph.sized:
        if (s.node, 0) not in where or nodes[where[(s.node, 0)][0]].op == INPUT:
            continue  # a number of a node the tail reads as an input (h, a forward input, a parameter)
        index = -1
        if s.input >= 0:
            meta = next(n.outs[0] for n in graph.nodes if n.op == INPUT and n.args["index"] == s.input)
            index = nodes[source("input", s.input, meta)].args["index"]
        sized.append(s.model_copy(update={"node": where[(s.node, 0)][0], "input": index}))
    outputs = [where[tuple(o)] for o in graph.outputs]
    tail = Graph(nodes=nodes, outputs=outputs, constants=graph.constants, sized=sized)
    return {"graph": tail, "sources": sources}


# views a tail may hold (the families it goes to take those they can, and name the others)
VIEW_OPS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default"}
VIEW_OPS |= pointwise.DIM_VIEWS.keys() | pointwise.PASS_THROUGH
_STAGE_OPS = reduce.REDUCTIONS | moments.NORMS | {layernorm.NORM} | pool.POOLS.keys()
# softmax and log-softmax: a logsumexp kept per row, then the map x - lse (exp of it for softmax)
SOFTMAX = {
    "aten._softmax.default": True,
    "aten.softmax.int": True,
    "aten._log_softmax.default": False,
    "aten.log_softmax.int": False,
}
# ops that draw random numbers (dropout in training mode): no kernel can match them exactly
RANDOM = {
    "aten.bernoulli_.float",
    "aten.bernoulli.default",
    "aten.bernoulli.p",
    "aten.native_dropout.default",
    "aten.rand_like.default",
    "aten.randn_like.default",
    "aten.uniform_.default",
    "aten.normal_.default",
}


def expanded(graph: Graph) -> Graph:
    """The graph with each softmax (log-softmax) over a dim as a logsumexp over that dim, kept, and the
    map exp(x - lse) (x - lse): a statistic and a map, which the normalize family composes. A softmax of
    a view that merges a run of dims into its dim, its value read only by views back to the unmerged
    shape (x.view(b, c, -1).softmax(2).view(b, c, d, h, w)), is one over that run of the unmerged value,
    those views dropped. Unchanged where it holds none."""
    if not any(n.op in SOFTMAX for n in graph.nodes):
        return graph
    nodes: list[Node] = []
    where: dict[tuple[int, int], list[int]] = {}
    undone: dict[int, list[int]] = {}  # a view back to the unmerged shape -> the map's value

    def moved(value: Any) -> Any:
        if isinstance(value, list):
            return [moved(v) for v in value]
        ref = graph.ref(value)
        return {"ref": where[ref]} if ref is not None else value

    for i, node in enumerate(graph.nodes):
        if i in undone:
            where[(i, 0)] = undone[i]
            continue
        args = {k: moved(v) for k, v in node.args.items()}
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
        made = Meta(shape=kept, strides=[0] * len(kept), dtype=x.dtype)  # the kernel's own layout
        nodes.append(
            Node(op="aten.logsumexp.default", args={"self": value, "dim": dims, "keepdim": True}, outs=[made])
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


_RESHAPES = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}


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
    """The first op of the tail that is neither elementwise, a view, a reduction, a norm nor a pooling
    (one that draws random numbers first: dropout in training mode)."""
    wanted = {n for n, _ in graph.needed()}
    random = next((n.op for i, n in enumerate(graph.nodes) if i in wanted and n.op in RANDOM), None)
    if random is not None:
        return f"{random} (random numbers: dropout in training mode)"
    for i, n in enumerate(graph.nodes):
        staged = n.op in _STAGE_OPS or n.op in _conv().CONVS
        known = _elementwise(n.op) or n.op in views or n.op in VIEW_OPS or staged or n.op == INPUT
        if i in wanted and not known:
            return n.op
    return None


def with_params(graph: Graph, sources: list[list[Any]]) -> Graph:
    """The tail graph with each INPUT that is a parameter or buffer (its source ["param", name]) a
    PARAM node of that name again: moments reads a norm's weights by name, and the tail's launch reads
    them from the one ModelNew (Model's constructor run in it) by `get_parameter`/`get_buffer`."""
    nodes = []
    for n in graph.nodes:
        index = int(n.args["index"]) if n.op == INPUT else 0
        if index > 0 and sources[index - 1][0] == "param":
            n = Node(op=PARAM, args={"name": sources[index - 1][1]}, outs=n.outs)
        nodes.append(n)
    return graph.model_copy(update={"nodes": nodes})


def _whole(
    graph: Graph,
    sources: list[list[Any]],
    families: tuple,
    why: list[str],
    counted: Collection[str] | None = None,
) -> dict | None:
    """The tail as the first of `families` composes it at its first feasible round-0 knob set (what
    each refused, appended to `why`). A batch norm in training mode counts its batch in the counter of
    its module among `counted` (the whole graph's: the tail holds no add_ that nothing reads); None:
    not known, and such a norm is refused."""
    for family in families:
        try:
            spec = family.compose(with_params(graph, sources) if family is moments else graph)
        except Refusal as e:
            why.append(f"{family.FAMILY}: {e}")
            continue
        if spec.get("tail") or spec.get("prelude"):  # a convolution's own launches: segments of this chain
            why.append(f"{family.FAMILY}: launches of its own before or after it")
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


def _conv() -> Any:
    """The conv family, whose convolution may be one launch of a prelude or a tail: imported where used,
    as conv composes its own prelude and tail with this module."""
    from kernelbrain.templates.families import conv

    return conv


def _stages(graph: Graph) -> tuple:
    """The families of STAGES worth trying on the graph whole: the one of its convolution, norm or
    pooling, else pointwise where it holds no stage at all."""
    ops = {n.op for n in graph.nodes}
    if ops & _conv().CONVS:
        return (_conv(),)
    if ops & moments.NORMS:
        return (moments,)
    if layernorm.NORM in ops:
        return (layernorm,)
    if ops & pool.POOLS.keys():
        return (pool,)
    return () if ops & (_STAGE_OPS | _conv().CONVS) else (pointwise,)


def compose(tail: dict, after: str, views: Collection[str] = (), place: str = "after") -> dict:
    """The tail ({"graph", "sources", "counted"} from `split`; without "counted" a batch norm in
    training mode with running statistics is refused) as the first family of FAMILIES composes it, with
    the knobs it runs at; else as the first of STAGES does; else as a chain of launches ("then"): a
    first segment (the graph up to one value, as large as one family takes whole) and the rest over that
    value composed the same way. A later launch may read h again, or any value before it, besides
    forward's tensors: its sources name them ["value", k] (0: h, k: what launch k-1 made). A softmax is
    a logsumexp and a map (`expanded`). Raises NotTail naming the op no family takes (`after`: what
    precedes it; "before" as `place` for a prelude's)."""
    graph = expanded(tail["graph"])
    foreign = _first_foreign(graph, views)
    if foreign is not None:
        raise NotTail(f"{foreign} {place} the {after}")
    why: list[str] = []
    found = _compose(graph, tail["sources"], 0, tail.get("counted"), why)
    if found is None:
        raise NotTail(f"ops {place} the {after} no memory-bound family takes ({'; '.join(why)})")
    return found


def prelude(graph: Graph, value: tuple[int, int], views: Collection[str], before: str) -> tuple[Graph, dict]:
    """The launches that make `value`, an operand of a compute-bound op that no forward input is (a
    pooling of one), composed as a tail is: its INPUT 0 the first forward input it reads ("input": that
    input's position), its sources forward's other tensors and parameters. With it, the graph in which
    `value` is an INPUT of its own ("at": its index, past forward's), which the op reads as it would a
    forward input (`reading` names it). Raises NotTail."""
    if value[1] != 0:
        raise NotTail(f"{graph.nodes[value[0]].op}'s second result before the {before}")
    made = Graph(nodes=graph.nodes, outputs=[list(value)], constants=graph.constants, sized=graph.sized)
    needed = sorted({n for n, _ in made.needed()})
    first = next((n for n in needed if graph.nodes[n].op == INPUT), None)
    if first is None:
        raise NotTail(f"{graph.nodes[value[0]].op} of no forward input before the {before}")
    before_graph = _tail_graph(made, (first, 0), [n for n in needed if n != first])
    composed = compose({**before_graph, "counted": moments.counters(graph)}, before, views, "before")
    at = 1 + max(int(n.args["index"]) for n in graph.nodes if n.op == INPUT)
    nodes = list(graph.nodes)
    nodes[value[0]] = Node(op=INPUT, args={"index": at}, outs=[graph.meta(value)])
    sized = [s for s in graph.sized if s.node != value[0]]
    replaced = Graph(nodes=nodes, outputs=graph.outputs, constants=graph.constants, sized=sized)
    return replaced, {**composed, "input": int(graph.nodes[first].args["index"]), "at": at}


def input_prelude(
    graph: Graph, value: Any, views: Collection[str], before: str
) -> tuple[Graph, tuple[int, int] | None, dict | None]:
    """A compute-bound op's input `value` followed back through pass-through views to what makes it:
    (the graph, that source, None) where a forward input or a parameter does, else the source made an
    INPUT of the graph by `prelude`, with the prelude's launches. Raises NotTail."""
    src = graph.ref(value)
    while src is not None and graph.nodes[src[0]].op in pointwise.PASS_THROUGH:
        src = graph.ref(graph.nodes[src[0]].args["self"])
    if src is None or graph.nodes[src[0]].op in (INPUT, PARAM):
        return graph, src, None
    graph, made = prelude(graph, src, views, before)
    return graph, src, made


PRELUDE = "kb_x"  # what forward names the prelude's value


def reading(forward: list[str], before: dict | None) -> list[str]:
    """The names of the tensors a head with a prelude (or None) reads by input index: forward's, and the
    prelude's value at its index."""
    if before is None:
        return forward
    names = [*forward, *[""] * (before["at"] + 1 - len(forward))]
    names[before["at"]] = PRELUDE
    return names


def prelude_call(before: dict, forward: list[str], read: Any) -> str:
    """The lines of forward (indented for a method) setting PRELUDE: `read(source, forward)` the
    expression of each of its sources."""
    args = [forward[before["input"]], *(read(s, forward) for s in before["sources"])]
    return call(before, args, PRELUDE, PRE)


def _compose(
    graph: Graph, sources: list[list[Any]], depth: int, counted: Collection[str] | None, why: list[str]
) -> dict | None:
    """`compose` over a graph whose INPUT 0 is the chain's value `depth`, its sources absolute (forward
    inputs, parameters, earlier values of the chain); None where nothing takes it (why appended)."""
    whole = _whole(graph, sources, FAMILIES + _stages(graph), why, counted)
    if whole is not None:
        return whole
    refused: list[str] = []
    for value in _cuts(graph):
        try:
            read, _, rest = _cut(graph, _made(graph, value), "")
        except NotTail:
            continue  # the rest reads more than one value of what the head makes
        if read != value:
            continue
        head = pruned(
            Graph(nodes=graph.nodes, outputs=[list(value)], constants=graph.constants, sized=graph.sized)
        )
        segment = _whole(head, sources, FAMILIES + _stages(head), [], counted)
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


def _cuts(graph: Graph) -> list[tuple[int, int]]:
    """The values a first segment may end at, the latest first: each value the output needs that an op
    of the graph makes, the output itself left out."""
    needed = graph.needed() - {tuple(graph.outputs[0])}
    return sorted((r for r in needed if graph.nodes[r[0]].op not in (INPUT, PARAM)), reverse=True)


def _made(graph: Graph, value: tuple[int, int]) -> set[tuple[int, int]]:
    """The values an op of the graph makes that `value` needs (it included)."""
    head = Graph(nodes=graph.nodes, outputs=[list(value)])
    return {r for r in head.needed() if graph.nodes[r[0]].op not in (INPUT, PARAM)}


def pruned(graph: Graph) -> Graph:
    """The graph with only the nodes its outputs need, renumbered (a family counts every node's op)."""
    keep = sorted({n for n, _ in graph.needed()} | {i for i, n in enumerate(graph.nodes) if n.op == INPUT})
    at = {old: new for new, old in enumerate(keep)}

    def moved(value: Any) -> Any:
        if isinstance(value, list):
            return [moved(v) for v in value]
        ref = graph.ref(value)
        return {"ref": [at[ref[0]], ref[1]]} if ref is not None else value

    nodes = [
        Node(
            op=graph.nodes[i].op,
            args={k: moved(v) for k, v in graph.nodes[i].args.items()},
            outs=graph.nodes[i].outs,
        )
        for i in keep
    ]
    sized = [s.model_copy(update={"node": at[s.node]}) for s in graph.sized if s.node in at]
    outputs = [[at[o[0]], o[1]] for o in graph.outputs]
    return Graph(nodes=nodes, outputs=outputs, constants=graph.constants, sized=sized)


def feasible(tail: dict) -> bool:
    family = next(f for f in (*FAMILIES, *STAGES, _conv()) if tail["family"] == f.FAMILY)
    fits = family.feasible(tail["spec"], tail["knobs"])
    return fits and (tail["then"] is None or feasible(tail["then"]))


def describe(tail: dict) -> str:
    """The tail's families and knobs, in launch order, for a candidate's docstring."""
    knobs = ", ".join(f"{k}={v}" for k, v in tail["knobs"].items())
    here = f"{tail['family']} ({knobs})"
    return here if tail["then"] is None else f"{here}, then {describe(tail['then'])}"
