"""The small base every op family stands on: the one contract the expert generator asks of each entry of
FAMILIES (`Family`, `Refining`), the contract of a compute-bound family the composer builds candidates
around (`Head`), the refusal a composed family raises (`Refusal`), the one `matches` of the families
composed from the traced graph (`matches_by`), the mutation table of the families with one tile axis
(`tile_mutations`), and the checks every compose starts with (`one_output`, `the_one`, `unsized`). A
family is a module (its kernels real `@triton.jit` functions in its folder's `parts`, copied by
`render`); tests/test_templates.py checks every entry of FAMILIES against these names and signatures.
Not a registry: FAMILIES lists the families in match order."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol, runtime_checkable

from kernelbrain.core.graph import Graph

Knobs = dict[str, Any]
FLOATS = frozenset({"float32", "float16", "bfloat16"})  # the dtypes the families compute in
Moves = list[tuple[str, str]]  # (move, why) pairs: what mutate may do about one profile label


@runtime_checkable
class Family(Protocol):
    FAMILY: str
    # round 0: knob sets spread over the family's strategy axes, each with a "strategy"
    ROUND0: list[Knobs]
    # a profile's bottleneck label -> (move, why): what mutate may do about it
    MUTATIONS: dict[str, Moves]

    def matches(self, ops: list[dict[str, Any]], graph: Graph | None = None) -> dict[str, Any] | None:
        """The spec extracted from the traced reference (its op list and ATen graph), or None."""
        ...

    def feasible(self, spec: dict[str, Any], knobs: Knobs) -> bool:
        """Whether a knob set can serve the spec's shape (registers, shared memory, grid limits)."""
        ...

    def mutate(self, knobs: Knobs, move: str) -> Knobs | None:
        """The knobs a move makes of a parent's, or None where the move does not apply."""
        ...

    def render(self, spec: dict[str, Any], knobs: Knobs, signature: dict[str, list[str]]) -> str:
        """A standalone candidate module defining ModelNew."""
        ...


@runtime_checkable
class Refining(Family, Protocol):
    """A family that needs what the trace cannot show (parameter names, normalised dims)."""

    def refine(self, spec: dict[str, Any], problem_source: str | None) -> dict[str, Any] | None:
        """The spec completed from the problem's source, or None where the source shows what the family
        cannot reproduce."""
        ...


class Head(Protocol):
    """A compute-bound family that heads a composed candidate (conv, conv_transpose, contraction): the
    composer (compose/) cuts its op and the chain after it out of the traced graph, composes what comes
    before and after as stages of other families, and renders the candidate around the stage this family
    renders (`sections`, `launch`). Its own spec, feasibility and refinement are the head's alone."""

    FAMILY: str
    ROUND0: list[Knobs]
    MUTATIONS: dict[str, Moves]
    HEAD: str  # what its op is called in a refusal ("convolution")
    CHAIN: Collection[str]  # the ops its chain may hold besides elementwise ones (views)
    INPUT_ARG: str | None  # the op's argument a prelude may make (None: it has no prelude)
    REFUSAL: type[Refusal]  # what it raises, a stage's refusal included
    TAIL_NOTE: str  # how its docstring introduces the tail
    STAGE_ORDER: tuple[str, ...]  # where the stages' parts go after its own ("prelude", "tail")

    def head(self, graph: Graph) -> int:
        """The node of its op in the traced graph, or its refusal."""
        ...

    def compose(self, graph: Graph) -> dict[str, Any]:
        """The spec of a graph the composer cut: its op and the chain after it, up to the output."""
        ...

    def feasible(self, spec: dict[str, Any], knobs: Knobs) -> bool: ...

    def mutate(self, knobs: Knobs, move: str) -> Knobs | None: ...

    def refine(self, spec: dict[str, Any], problem_source: str | None) -> dict[str, Any] | None: ...

    def reads(self, spec: dict[str, Any]) -> list[list]:
        """The tensors its launch reads: ["input", index] and ["param", state-dict name] sources."""
        ...

    def title(self, spec: dict[str, Any], knobs: Knobs) -> str:
        """The candidate's docstring, as far as the head goes."""
        ...

    def sections(self, spec: dict[str, Any], knobs: Knobs) -> list[str]:
        """Its part of the candidate module: constants, chains and parts."""
        ...

    def launch(self, spec: dict[str, Any], knobs: Knobs, names: list[str]) -> str:
        """The lines of forward setting kb_h, `names` the tensors it may read by input index."""
        ...


class Refusal(ValueError):
    """What a traced graph holds that a family cannot compose, named in the message. Each family's own
    refusal (NotReduction, NotConv, ...) is one, so that whoever tries several families catches them as
    one."""


def op_name(op: dict[str, Any]) -> str:
    """A recorded op's name (the trace's op list, not the graph's) with its dunder spelling folded onto
    the plain one: "__truediv__" -> "div"."""
    name = str(op["op"]).strip("_")
    return {"truediv": "div", "true_divide": "div"}.get(name, name)


def matches_by(
    compose: Callable[[Graph], dict[str, Any]],
) -> Callable[[list[dict[str, Any]], Graph | None], dict[str, Any] | None]:
    """The `matches` of a family composed from the traced graph: its `compose` of the graph, None where
    no graph was captured or the family refuses it."""

    def matches(ops: list[dict[str, Any]], graph: Graph | None = None) -> dict[str, Any] | None:
        if graph is None:
            return None
        try:
            return compose(graph)
        except Refusal:
            return None

    return matches


# the profile labels (core/diagnosis.py) by the keyword tile_mutations takes for each
LABELS = {
    "near_peak": "memory-bound near peak",
    "latency": "latency or occupancy-limited",
    "launch": "launch-bound",
    "spills": "register spills",
    "compute": "compute-bound",
    "coalescing": "memory-bound with poor coalescing",
}
LARGER = ("larger_tiles", "more bytes in flight a program")
MORE_WARPS = ("more_warps", "more warps a program keep more loads in flight")
FEWER_WARPS = ("fewer_warps", "fewer warps, more registers each")
_TILE_MOVES: dict[str, Moves] = {
    "near_peak": [LARGER],
    "latency": [MORE_WARPS],
    "launch": [("larger_tiles", "fewer, fatter programs")],
    "spills": [("smaller_tiles", "fewer values a program")],
    "compute": [FEWER_WARPS],
    "coalescing": [("larger_tiles", "longer contiguous runs a program")],
}


def tile_mutations(**moves: Moves) -> dict[str, Moves]:
    """MUTATIONS of a family whose moves are sizing.step's (one tile axis and the warps) and its own: the
    common answer to each profile label, a keyword of LABELS replacing a label's moves."""
    unknown = set(moves) - set(LABELS)
    if unknown:
        raise ValueError(f"no profile label {', '.join(sorted(unknown))}")
    return {label: list(moves.get(key, _TILE_MOVES[key])) for key, label in LABELS.items()}


def one_output(graph: Graph, refusal: type[Refusal]) -> tuple[int, int]:
    """The graph's one output, or the family's refusal naming how many it has."""
    if len(graph.outputs) != 1:
        raise refusal(f"{len(graph.outputs)} outputs")
    return int(graph.outputs[0][0]), int(graph.outputs[0][1])


def the_one(graph: Graph, ops: Collection[str], refusal: type[Refusal], what: str) -> int:
    """The index of the graph's one node of `ops`, or the family's refusal naming how many `what` it has."""
    found = [i for i, n in enumerate(graph.nodes) if n.op in ops]
    if len(found) != 1:
        raise refusal(f"{len(found)} {what}")
    return found[0]


def unsized(graph: Graph, refusal: type[Refusal], allowed: Collection[tuple[int, str]] = ()) -> None:
    """The graph's `unsized` check (no constant computed from a size but `allowed`), its ValueError as the
    family's refusal."""
    try:
        graph.unsized(allowed)
    except ValueError as e:
        raise refusal(str(e)) from None
