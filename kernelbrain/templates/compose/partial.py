"""Partial kernels, labelled: the ops of the classes the user allowed (`kb run --allow-torch conv,matmul`,
core/torch_ops.py) kept as PyTorch calls, the rest of the traced graph composed by the memory-bound
families as Triton launches:

    h = aten_op(x, weight, ...)           the head: PyTorch, reading ModelNew's own parameters
    y = tail(h, t1, t2, ...)              compose/stages.py's composition of what follows, in Triton

The graph is cut at the allowed ops: the head is every allowed op and what it reads, which may be only
forward inputs, the model's parameters and views that carry no size (`t`, `permute`, `detach`); each head
node is written as the ATen call the trace recorded (`torch.ops.aten.convolution.default(...)`), its
arguments as traced. The rest (every node the output needs that the head did not make) is a tail graph
whose INPUT 0 is the head's last value read after it, given to `stages.compose`. ModelNew runs the
problem's own constructor, so the parameters are Model's under the same names.

The candidate is labelled with the classes its head uses (`CandidateProposed.torch_ops`); the gate then
admits exactly their ATen ops besides its Triton kernels. Round 0 spreads over the tail family's round-0
knob sets; mutations move the tail's knobs as that family's MUTATIONS say.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core import torch_ops
from kernelbrain.core.events import Launch
from kernelbrain.core.graph import INPUT, PARAM, Graph
from kernelbrain.templates import model_source
from kernelbrain.templates.base import Refusal
from kernelbrain.templates.compose import plan, stages
from kernelbrain.templates.compose.cut import NotTail, tail_graph
from kernelbrain.templates.compose.render import HEAD, SUFFIX, call, render_parts
from kernelbrain.templates.families import conv, pointwise
from kernelbrain.templates.render import constants, model_attr, module, refined_model, tensor

FAMILY = "partial"
ROUND0_MAX = 3  # partial candidates in a first round: tail knob sets, the tail family's first feasible ones
# views a head may hold between forward inputs or parameters and an allowed op: none carries a size
# (a size traced at one shape would be wrong at the gate's and the ladder's others); all are glue to the gate
HEAD_VIEWS = frozenset({"t", "transpose", "permute", "unsqueeze", "squeeze", "detach", "clone", "alias"})
TAILS = {f.FAMILY: f for f in (*stages.FAMILIES, *stages.STAGES, conv)}  # a convolution may be a launch
_EXTRA_KNOBS = ("torch", "tail")  # the knobs this family adds to the tail family's


class NotPartial(Refusal):
    """Why the graph cannot be cut at the allowed ops into a torch head and a composed tail."""


def _head(graph: Graph, allowed: tuple[str, ...]) -> tuple[set[int], list[str]]:
    """The head's nodes (the allowed ops and everything they read) and the classes they use."""
    at = [i for i, n in enumerate(graph.nodes) if torch_ops.class_of(n.op) in allowed]
    needed = {n for n, _ in graph.needed()}
    at = [i for i in at if i in needed]
    if not at:
        raise NotPartial(f"no op of the allowed classes ({', '.join(allowed)}) in the forward")
    head = set(at)
    for j in sorted(at, reverse=True):
        for value in graph.nodes[j].args.values():
            head.update(r[0] for r in graph.refs(value))
    for j in range(max(head), -1, -1):  # what the head reads, transitively
        if j in head:
            for value in graph.nodes[j].args.values():
                head.update(r[0] for r in graph.refs(value))
    for j in sorted(head):
        n = graph.nodes[j]
        if n.op in (INPUT, PARAM) or j in at:
            continue
        if torch_ops.packet(n.op) not in HEAD_VIEWS:
            first = torch_ops.class_of(graph.nodes[at[0]].op)
            raise NotPartial(f"{n.op} before the {first} op it feeds: only views may lead to a torch op")
    sized = [s for s in graph.sized if s.node in head]
    if sized:
        raise NotPartial(f"{graph.nodes[sized[0].node].op}'s {sized[0].arg}, a number computed from a size")
    classes = sorted({c for i in at if (c := torch_ops.class_of(graph.nodes[i].op)) is not None})
    return head, classes


def _rest(graph: Graph, head: set[int]) -> tuple[tuple[int, int], dict[str, Any]]:
    """The graph after the head: (h, {"graph", "sources"}) as stages.compose takes it. INPUT 0 is h (the
    head's last value read after it); a further INPUT is another head value ["torch", node, out], a
    forward input ["input", i] or a parameter ["param", name]."""
    wanted = {tuple(o) for o in graph.outputs}
    keep: list[int] = []
    read: set[tuple[int, int]] = set()
    for j in range(len(graph.nodes) - 1, -1, -1):
        outs = [(j, k) for k in range(len(graph.nodes[j].outs))]
        if not any(r in wanted for r in outs):
            continue
        if j in head and graph.nodes[j].op not in (INPUT, PARAM):
            read |= {r for r in outs if r in wanted}
            continue
        keep.append(j)
        for value in graph.nodes[j].args.values():
            wanted.update(graph.refs(value))
    if tuple(graph.outputs[0]) in read:
        raise NotPartial("the output is the torch ops' own: nothing is left for Triton")
    if not read:
        raise NotPartial("nothing after the torch ops reads them")
    h = max(read)
    also = [(r, ["torch", r[0], r[1]]) for r in sorted(read - {h})]
    return h, tail_graph(graph, h, sorted(keep), also)


def compose(graph: Graph, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The spec of a partial candidate: the head's nodes, the classes it uses, and the tail composed (at
    its family's first feasible round-0 knobs). Raises NotPartial naming what stands in the way."""
    if len(graph.outputs) != 1:
        raise NotPartial(f"{len(graph.outputs)} outputs")
    head, classes = _head(graph, allowed)
    h, rest = _rest(graph, head)
    after = graph.nodes[h[0]].op.split(".")[1] if "." in graph.nodes[h[0]].op else graph.nodes[h[0]].op
    try:
        composed = stages.compose(rest, after, pointwise.PASS_THROUGH)
    except NotTail as e:
        raise NotPartial(str(e)) from None
    return {
        "head": sorted(j for j in head if graph.nodes[j].op not in (INPUT, PARAM)),
        "graph": graph.model_dump(mode="json"),
        "h": list(h),
        "classes": classes,
        "tail": composed,
    }


def refine(spec: dict[str, Any], problem_source: str | None) -> dict[str, Any] | None:
    """The problem's constructor, run by ModelNew so that its parameters are Model's."""
    return model_source.with_constructor(spec, problem_source)


def knobs_of(spec: dict[str, Any], tail_knobs: dict[str, Any]) -> dict[str, Any]:
    """A candidate's knobs: the tail family's, and what the head keeps in torch."""
    return {**tail_knobs, "torch": ",".join(spec["classes"]), "tail": spec["tail"]["family"]}


def _tail_with(spec: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    return {**spec["tail"], "knobs": {k: v for k, v in knobs.items() if k not in _EXTRA_KNOBS}}


def round0(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Knob sets spread over the tail family's round 0: its first ROUND0_MAX feasible ones."""
    family = TAILS[spec["tail"]["family"]]
    sets = [k for k in family.ROUND0 if stages.feasible({**spec["tail"], "knobs": k})]
    return [knobs_of(spec, k) for k in sets[:ROUND0_MAX]]


def mutations(
    spec: dict[str, Any], knobs: dict[str, Any], label: str
) -> list[tuple[dict[str, Any], str, str]]:
    """(knobs, move, why) for each move of the tail family's MUTATIONS under a profile's label."""
    family = TAILS[spec["tail"]["family"]]
    base = {k: v for k, v in knobs.items() if k not in _EXTRA_KNOBS}
    out = []
    for move, why in family.MUTATIONS.get(label, []):
        moved = family.mutate(base, move)
        if moved is not None and stages.feasible({**spec["tail"], "knobs": moved}):
            out.append((knobs_of(spec, moved), move, why))
    return out


def _literal(key: str, value: Any) -> str:
    if isinstance(value, dict) and "float" in value:
        return f"float({value['float']!r})"
    if isinstance(value, dict):
        raise NotPartial(f"a torch op's {key} that is not a plain value ({next(iter(value))})")
    if isinstance(value, list):
        return "[" + ", ".join(_literal(key, v) for v in value) + "]"
    if isinstance(value, str) and key == "dtype":
        return f"torch.{value}"
    return repr(value)


def head_lines(spec: dict[str, Any], forward: list[str]) -> tuple[list[str], str]:
    """The lines of forward (indented for a method) that run the head in torch, each node's value named
    kb_v<node>, and the expression of h (the value the tail reads as its INPUT 0)."""
    graph = Graph.model_validate(spec["graph"])
    names: dict[tuple[int, int], str] = {}
    for j, n in enumerate(graph.nodes):
        if n.op == INPUT:
            names[(j, 0)] = forward[int(n.args["index"])]
        elif n.op == PARAM:
            names[(j, 0)] = model_attr(str(n.args["name"]))

    def expr(key: str, value: Any) -> str:
        if isinstance(value, list) and any(graph.ref(v) is not None for v in value):
            return "[" + ", ".join(expr(key, v) for v in value) + "]"
        ref = graph.ref(value)
        return names[ref] if ref is not None else _literal(key, value)

    lines = []
    for j in spec["head"]:
        n = graph.nodes[j]
        call = ", ".join(f"{k}={expr(k, v)}" for k, v in n.args.items())
        lines.append(f"        kb_v{j} = torch.ops.{n.op}({call})\n")
        for k in range(len(n.outs)):
            names[(j, k)] = f"kb_v{j}" if len(n.outs) == 1 else f"kb_v{j}[{k}]"
    return lines, names[(int(spec["h"][0]), int(spec["h"][1]))]


def _value(what: list[Any], graph: Graph) -> str:
    """A head value the tail reads, ["torch", node, out], by the name head_lines gives it."""
    node, out = int(what[1]), int(what[2])
    return f"kb_v{node}" if len(graph.nodes[node].outs) == 1 else f"kb_v{node}[{out}]"


def render(spec: dict[str, Any], knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    """The candidate: ModelNew running the head's torch ops, then the tail's launches at `knobs`."""
    forward = signature["forward"]
    rest = _tail_with(spec, knobs)
    lines, h = head_lines(spec, forward)
    graph = Graph.model_validate(spec["graph"])
    args = [h, *(_value(s, graph) if s[0] == "torch" else tensor(s, forward) for s in rest["sources"])]
    classes = ", ".join(spec["classes"])
    in_torch = ", ".join(dict.fromkeys(graph.nodes[j].op for j in spec["head"]))
    doc = (
        f"Partial kernel, labelled torch: {classes}. PyTorch runs {in_torch} (allowed by --allow-torch), "
        f"reading the model's own parameters;\nthe rest is composed from the reference's ATen graph by "
        f"kernelbrain's memory-bound families: {stages.describe(rest)}.\n"
    )
    forward_lines = "".join(lines) + call(rest, args, HEAD) + f"        return {HEAD}\n"
    return module(
        doc,
        constants(TORCH_OPS=spec["classes"]),
        render_parts(rest),
        refined_model(spec, signature, forward_lines),
    )


def launches(spec: dict[str, Any], knobs: dict[str, Any], signature: dict[str, list[str]]) -> list[Launch]:
    """The candidate's plan: its head's torch ops (one launch of family "torch", reading the forward
    inputs and parameters they read), then the tail's launches."""
    forward = signature["forward"]
    rest = _tail_with(spec, knobs)
    graph = Graph.model_validate(spec["graph"])
    read = sorted({r[0] for j in spec["head"] for v in graph.nodes[j].args.values() for r in graph.refs(v)})
    sources = [_source_of(graph.nodes[i]) for i in read if graph.nodes[i].op in (INPUT, PARAM)]
    _, h = head_lines(spec, forward)
    reads = [plan.name(s, forward) for s in sources]
    head = Launch(
        stage="head", family="torch", knobs={"torch": ",".join(spec["classes"])}, reads=reads, writes=h
    )
    args = [h, *(_value(s, graph) if s[0] == "torch" else plan.name(s, forward) for s in rest["sources"])]
    return [head, *plan.stage(rest, "tail", args, HEAD, SUFFIX)]


def _source_of(node: Any) -> list[Any]:
    return ["input", int(node.args["index"])] if node.op == INPUT else ["param", str(node.args["name"])]
