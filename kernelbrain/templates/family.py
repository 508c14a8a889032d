"""The one contract of an op family: what the expert generator asks of each module in FAMILIES. A family
is a module (its kernels real `@triton.jit` functions in a `*_parts` module, composed by `render`);
tests/test_templates.py checks every module in FAMILIES against these names and signatures."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from kernelbrain.core.graph import Graph

Knobs = dict[str, Any]


@runtime_checkable
class Family(Protocol):
    FAMILY: str
    # round 0: knob sets spread over the family's strategy axes, each with a "strategy"
    ROUND0: list[Knobs]
    # a profile's bottleneck label -> (move, why): what mutate may do about it
    MUTATIONS: dict[str, list[tuple[str, str]]]

    def matches(self, ops: list[dict], graph: Graph | None = None) -> dict | None:
        """The spec extracted from the traced reference (its op list and ATen graph), or None."""
        ...

    def feasible(self, spec: dict, knobs: Knobs) -> bool:
        """Whether a knob set can serve the spec's shape (registers, shared memory, grid limits)."""
        ...

    def mutate(self, knobs: Knobs, move: str) -> Knobs | None:
        """The knobs a move makes of a parent's, or None where the move does not apply."""
        ...

    def render(self, spec: dict, knobs: Knobs, signature: dict[str, list[str]]) -> str:
        """A standalone candidate module defining ModelNew."""
        ...


@runtime_checkable
class Refining(Family, Protocol):
    """A family that needs what the trace cannot show (parameter names, normalised dims)."""

    def refine(self, spec: dict, problem_source: str | None) -> dict | None:
        """The spec completed from the problem's source, or None where the source shows what the family
        cannot reproduce."""
        ...
