"""A compute-bound head family with its stages, as one Family for the expert generator: the composer cuts
the traced graph (stages.with_stages), the head family composes and renders its own stage, and this
module renders the candidate around it: the prelude's launches, the head's, the tail's, in one ModelNew."""

from __future__ import annotations

from typing import Any

from kernelbrain.core.events import Launch
from kernelbrain.core.graph import Graph
from kernelbrain.templates import model_source
from kernelbrain.templates.base import Head, Knobs, matches_by
from kernelbrain.templates.compose import plan, stages
from kernelbrain.templates.compose.render import HEAD, PRE, PRELUDE, SUFFIX, call, reading, render_parts
from kernelbrain.templates.render import module, refined_model, tensor

STAGE_KEYS = ("tail", "prelude")  # what the composer adds to the head family's spec
PRELUDE_NOTE = "Its input made first, by launches of their own"


def head_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The head family's part of a composed spec."""
    return {k: v for k, v in spec.items() if k not in STAGE_KEYS}


class Composed:
    """The Family (base.Family, base.Refining) of candidates whose head is `family`'s (base.Head): its
    round 0 and mutations are the head's; what it matches, refines, checks and renders includes the
    stages the composer cut off and composed around it."""

    def __init__(self, family: Head) -> None:
        self.family = family
        self.FAMILY = family.FAMILY
        self.ROUND0 = family.ROUND0
        self.MUTATIONS = family.MUTATIONS
        self.__name__ = f"composed {family.FAMILY}"

    def __getattr__(self, name: str) -> Any:
        """Everything else is the head family's: its constants, refusal and helpers (`conv.CONVS`)."""
        if name == "family":  # not set yet (a copy being made): no family to ask
            raise AttributeError(name)
        return getattr(self.family, name)

    def compose(self, graph: Graph) -> dict[str, Any]:
        """The head family's spec of the head with "ops" (the whole graph's), "tail" and "prelude"."""
        return stages.with_stages(self.family, graph)

    def matches(self, ops: list[dict[str, Any]], graph: Graph | None = None) -> dict[str, Any] | None:
        return matches_by(self.compose)(ops, graph)

    def mutate(self, knobs: Knobs, move: str) -> Knobs | None:
        return self.family.mutate(knobs, move)

    def feasible(self, spec: dict[str, Any], knobs: Knobs) -> bool:
        """The head's knobs fit it, and every stage's launches fit theirs."""
        fits = self.family.feasible(head_spec(spec), knobs)
        return fits and all(stages.feasible(s) for s in (spec.get("tail"), spec.get("prelude")) if s)

    def refine(self, spec: dict[str, Any], problem_source: str | None) -> dict[str, Any] | None:
        """The head family's refinement, and Model's constructor where a stage reads its parameters."""
        refined = self.family.refine(spec, problem_source)
        if refined is None or "init_body" in refined:
            return refined
        sources = [s for stage in (spec.get("tail"), spec.get("prelude")) if stage for s in stage["sources"]]
        if any(s[0] == "param" for s in sources):
            return model_source.with_constructor(refined, problem_source)
        return refined

    def render(self, spec: dict[str, Any], knobs: Knobs, signature: dict[str, list[str]]) -> str:
        """The candidate: the head's docstring and parts, its stages' after them, and ModelNew running the
        prelude's launches, the head's and the tail's."""
        f, head = self.family, head_spec(spec)
        forward = signature["forward"]
        before, rest = spec.get("prelude"), spec.get("tail")
        doc = f.title(head, knobs)
        if rest is not None:
            doc += f"\n{f.TAIL_NOTE}: {stages.describe(rest)}.\n"
        if before is not None:
            doc += f"\n{PRELUDE_NOTE}: {stages.describe(before)}.\n"
        parts_of = {
            "prelude": render_parts(before, PRE) if before else "",
            "tail": render_parts(rest) if rest else "",
        }
        lines = ""
        if before is not None:
            args = [forward[before["input"]], *(tensor(s, forward) for s in before["sources"])]
            lines += call(before, args, PRELUDE, PRE)
        lines += f.launch(head, knobs, reading(forward, before))
        if rest is not None:
            lines += call(rest, [HEAD, *(tensor(s, forward) for s in rest["sources"])], HEAD)
        lines += f"        return {HEAD}\n"
        stage_parts = [parts_of[s] for s in f.STAGE_ORDER]
        return module(doc, *f.sections(head, knobs), *stage_parts, refined_model(spec, signature, lines))

    def plan(self, spec: dict[str, Any], knobs: Knobs, signature: dict[str, list[str]]) -> list[Launch]:
        """The candidate's launches: the prelude's, the head's, the tail's."""
        forward = signature["forward"]
        before, rest = spec.get("prelude"), spec.get("tail")
        out: list[Launch] = []
        if before is not None:
            args = [forward[before["input"]], *(plan.name(s, forward) for s in before["sources"])]
            out += plan.stage(before, "prelude", args, PRELUDE, PRE)
        names = reading(forward, before)
        reads = [plan.name(s, names) for s in self.family.reads(head_spec(spec))]
        out.append(Launch(stage="head", family=self.FAMILY, knobs=dict(knobs), reads=reads, writes=HEAD))
        if rest is not None:
            args = [HEAD, *(plan.name(s, forward) for s in rest["sources"])]
            out += plan.stage(rest, "tail", args, HEAD, SUFFIX)
        return out
