"""The offline `expert` generator: parametrised templates chosen by the reference's traced ops."""

from __future__ import annotations

from typing import Any

from kernelbrain.core import torch_ops
from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.generators.base import GenerationError, Generator, Proposal
from kernelbrain.templates import FAMILIES
from kernelbrain.templates.base import Family, Refining
from kernelbrain.templates.compose import partial, plan_of
from kernelbrain.templates.decompose import expand


def _describe(ops: list[dict]) -> str:
    return ", ".join(sorted({o["op"] for o in ops})) or "no torch ops"


class ExpertGenerator(Generator):
    """Candidates all in Triton from the first family that matches; and, where the user allowed classes
    of torch ops (`allow_torch`, core/torch_ops.py), partial candidates that keep those ops in PyTorch
    and compose the rest (templates/compose/partial.py), labelled with the classes they keep. Each
    proposal carries its plan of launches (templates/compose.plan_of)."""

    name = "expert"

    def __init__(self, allow_torch: tuple[str, ...] | list[str] = ()) -> None:
        self.allow_torch = torch_ops.parse(allow_torch)

    def match_family(
        self, analysis: ProblemAnalysed, name: str | None = None, problem_source: str | None = None
    ) -> tuple[Family, dict]:
        graph = expand(analysis.graph) if analysis.graph is not None else None
        for family in FAMILIES:
            if name is not None and name != family.FAMILY:
                continue
            spec = family.matches(analysis.ops, graph)
            primary = family.matches(analysis.primary_ops, graph) if analysis.primary_ops else spec
            if spec is not None and primary is None:
                continue  # what the rungs time is this family's, the file's own shape is not (CPU)
            # what the trace cannot show (parameter names, normalised dims) a family reads from the source
            if spec is not None and isinstance(family, Refining):
                spec = family.refine(spec, problem_source)
            if spec is not None:
                return family, spec
        raise GenerationError(f"no offline template matches {_describe(analysis.ops)}; use --generator llm")

    @staticmethod
    def checked_specs(family: Family, spec: dict, analysis: ProblemAnalysed) -> list[dict]:
        """The specs a knob set must be feasible at: the shape the rungs time and, where that is not the
        file's primary shape (CPU), the primary too (match_family made sure the family matches it): an
        export must not refuse the user's real size."""
        if not analysis.primary_ops:
            return [spec]
        graph = expand(analysis.graph) if analysis.graph is not None else None
        return [spec, family.matches(analysis.primary_ops, graph)]

    @staticmethod
    def _proposal(
        family: Any, spec: dict, knobs: dict, analysis: ProblemAnalysed, hint: str, diagnosis: list[str]
    ) -> Proposal:
        """The proposal of a family's render (or the partial candidates', which keep the torch ops their
        spec names), with its plan."""
        return Proposal(
            source=family.render(spec, knobs, analysis.signature),
            family=family.FAMILY,
            strategy=knobs["strategy"],
            knobs=knobs,
            hint=hint,
            diagnosis=diagnosis,
            torch_ops=spec["classes"] if family is partial else [],
            plan=plan_of(family, spec, knobs, analysis.signature),
        )

    def partial_spec(self, analysis: ProblemAnalysed, problem_source: str | None) -> dict:
        """The partial candidate's spec: the graph cut at the allowed ops (GenerationError saying why not)."""
        if not self.allow_torch:
            raise GenerationError("no class of torch ops is allowed (--allow-torch)")
        if analysis.graph is None:
            raise GenerationError("no traced graph to cut at the allowed torch ops")
        graph = expand(analysis.graph)
        try:
            spec = partial.compose(graph, self.allow_torch)
        except partial.NotPartial as e:
            raise GenerationError(
                f"no partial kernel with torch for {', '.join(self.allow_torch)}: {e}"
            ) from None
        refined = partial.refine(spec, problem_source)
        if refined is None:
            raise GenerationError("a partial kernel needs Model's constructor, which a candidate cannot hold")
        return refined

    def first_round(self, analysis: ProblemAnalysed, *, problem_source: str | None = None) -> list[Proposal]:
        """The matching family's round 0, all Triton; where torch ops are allowed, partial candidates first
        (up to partial.ROUND0_MAX), then those. GenerationError only where neither can be had."""
        out: list[Proposal] = []
        why: list[str] = []
        if self.allow_torch:
            try:
                spec = self.partial_spec(analysis, problem_source)
            except GenerationError as e:
                why.append(str(e))
            else:
                torch = ", ".join(spec["classes"])
                hint = "torch for {}, tail {}: {}"
                out += [
                    self._proposal(
                        partial, spec, k, analysis, hint.format(torch, k["tail"], k["strategy"]), []
                    )
                    for k in partial.round0(spec)
                ]
        try:
            family, spec = self.match_family(analysis, problem_source=problem_source)
        except GenerationError as e:
            if not out:
                raise GenerationError("; ".join([str(e), *why])) from None
            return out
        checked = self.checked_specs(family, spec, analysis)
        return out + [
            self._proposal(family, spec, knobs, analysis, f"strategy axis {knobs['strategy']}", [])
            for knobs in family.ROUND0
            if all(family.feasible(s, knobs) for s in checked)
        ]

    def mutate(
        self,
        analysis: ProblemAnalysed,
        parent_knobs: dict[str, Any],
        family_name: str,
        labels: list[str],
        *,
        parent_source: str | None = None,
        numbers: str | None = None,
        problem_source: str | None = None,
    ) -> list[Proposal]:
        if family_name == partial.FAMILY:
            spec = self.partial_spec(analysis, problem_source)
            return [
                self._proposal(partial, spec, knobs, analysis, f"{label} -> {move}: {why}", [label])
                for label in labels
                for knobs, move, why in partial.mutations(spec, parent_knobs, label)
            ]
        family, spec = self.match_family(analysis, family_name, problem_source)
        checked = self.checked_specs(family, spec, analysis)
        out = []
        for label in labels:
            for move, why in family.MUTATIONS.get(label, []):
                knobs = family.mutate(parent_knobs, move)
                if knobs is not None and all(family.feasible(s, knobs) for s in checked):
                    out.append(
                        self._proposal(family, spec, knobs, analysis, f"{label} -> {move}: {why}", [label])
                    )
        return out
