"""The offline `expert` generator: parametrised templates chosen by the reference's traced ops."""

from __future__ import annotations

from typing import Any

from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.generators.base import GenerationError, Generator, Proposal
from kernelbrain.templates import FAMILIES
from kernelbrain.templates.decompose import expand
from kernelbrain.templates.family import Family, Refining


def _describe(ops: list[dict]) -> str:
    return ", ".join(sorted({o["op"] for o in ops})) or "no torch ops"


class ExpertGenerator(Generator):
    name = "expert"

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

    def _proposal(
        self,
        family: Family,
        spec: dict,
        knobs: dict,
        analysis: ProblemAnalysed,
        hint: str,
        diagnosis: list[str] | None = None,
    ) -> Proposal:
        return Proposal(
            source=family.render(spec, knobs, analysis.signature),
            family=family.FAMILY,
            strategy=knobs["strategy"],
            knobs=knobs,
            hint=hint,
            diagnosis=diagnosis or [],
        )

    def first_round(self, analysis: ProblemAnalysed, *, problem_source: str | None = None) -> list[Proposal]:
        family, spec = self.match_family(analysis, problem_source=problem_source)
        checked = self.checked_specs(family, spec, analysis)
        return [
            self._proposal(family, spec, knobs, analysis, f"strategy axis {knobs['strategy']}")
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
