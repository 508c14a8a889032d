"""A candidate's plan: its launches in order, each naming its family, its stage, its knobs and the tensors
it reads and writes (core/events.Launch, recorded in CandidateProposed and shown by `kb audit`). The
names are those the candidate's forward gives: forward's parameters, `self.<name>` for Model's
parameters and buffers, and the values the launches set (kb_x a prelude's, kb_h the head's, kb_v<k>_tail
a tail's intermediate ones); a family that composes the whole graph itself is one launch writing OUTPUT."""

from __future__ import annotations

from typing import Any, Literal

from kernelbrain.core.events import Launch
from kernelbrain.templates.compose.render import links

OUTPUT = "output"  # what a single-launch candidate's forward returns
Stage = Literal["prelude", "head", "tail"]


def name(what: list[Any] | None, names: list[str]) -> str:
    """The name of a tensor a spec or a stage's source names: ["input", i] as `names[i]`,
    ["param", state-dict name] as self.<name>."""
    if what is None:
        return "None"
    return names[int(what[1])] if what[0] == "input" else f"self.{what[1]}"


def stage(composed: dict[str, Any], role: Stage, args: list[str], out: str, suffix: str) -> list[Launch]:
    """The launches of a composed stage (compose/stages.py) in order: args[0] names its value 0, args[i]
    its source i; its last launch sets `out`."""
    return [
        Launch(stage=role, family=at["family"], knobs=dict(at["knobs"]), reads=here, writes=target)
        for at, here, target, _ in links(composed, args, out, suffix)
    ]


def single(family: str, knobs: dict[str, Any], forward: list[str]) -> list[Launch]:
    """The plan of a family that composes the whole graph as one stage: it is passed forward's tensors
    and writes the output (the launches inside it are the family's own)."""
    return [Launch(stage="head", family=family, knobs=dict(knobs), reads=list(forward), writes=OUTPUT)]
