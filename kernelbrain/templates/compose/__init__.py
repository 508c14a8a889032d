"""The composer, above the families: it cuts a traced graph into stages (cut.py: a compute-bound head,
the prelude that makes its input, the tail after it; later, for whole models, regions) and composes
each stage from the families that take it (stages.py); the families render a stage, they never call
each other's compositions. A candidate's launches are recorded as its plan (plan.py, core/events.Launch).

`conv`, `conv_transpose` and `contraction` here are the families the expert generator takes
(templates.FAMILIES) for those heads: Composed wraps the head family with its stages (head.py).
`partial` makes candidates whose head is PyTorch ops the user allowed, the rest composed the same way.
"""

from typing import Any

from kernelbrain.core.events import Launch
from kernelbrain.templates.compose import partial, plan
from kernelbrain.templates.compose.head import Composed
from kernelbrain.templates.families import contraction as contraction_head
from kernelbrain.templates.families import conv as conv_head
from kernelbrain.templates.families import conv_transpose as conv_transpose_head

__all__ = ["Composed", "contraction", "conv", "conv_transpose", "partial", "plan_of"]

conv = Composed(conv_head)
conv_transpose = Composed(conv_transpose_head)
contraction = Composed(contraction_head)


def plan_of(
    family: Any, spec: dict[str, Any], knobs: dict[str, Any], signature: dict[str, list[str]]
) -> list[Launch]:
    """A candidate's plan: a composed family's launches (Composed.plan), a partial candidate's
    (partial.launches), or the one launch of a family that composes the whole graph itself."""
    if isinstance(family, Composed):
        return family.plan(spec, knobs, signature)
    if family is partial:
        return partial.launches(spec, knobs, signature)
    return plan.single(family.FAMILY, knobs, signature["forward"])
