"""The generator contract: propose a first spread, then mutate a profiled candidate."""

from __future__ import annotations

import abc
from typing import Any

from pydantic import BaseModel, ConfigDict

from kernelbrain.core.events import Launch, ProblemAnalysed


class GenerationError(Exception):
    """The generator cannot serve this problem; the message says what to do instead."""


class Unavailable(GenerationError):
    """The generator's service could not be had (refused, 5xx or a hang after retries, garbage replies):
    a passing fault, so the task waits for `kb resume` rather than ending the run."""


class Proposal(BaseModel):
    model_config = ConfigDict(frozen=True)
    source: str
    family: str
    strategy: str
    knobs: dict[str, Any]
    hint: str
    diagnosis: list[str] = []
    prompt: str | None = None
    reply: str | None = None
    tokens: int = 0
    torch_ops: list[str] = []  # the classes of torch ops it keeps in PyTorch (core/torch_ops.py)
    plan: list[Launch] = []  # its launches in order (templates/compose), where the generator knows them


class Generator(abc.ABC):
    name: str
    # replies that gave no proposal in the last call (their tokens were still spent); llm fills it
    discarded: list = []

    @abc.abstractmethod
    def first_round(self, analysis: ProblemAnalysed, *, problem_source: str | None = None) -> list[Proposal]:
        """Round 0: candidates spread over the strategy axes."""

    @abc.abstractmethod
    def mutate(
        self,
        analysis: ProblemAnalysed,
        parent_knobs: dict[str, Any],
        family: str,
        labels: list[str],
        *,
        parent_source: str | None = None,
        numbers: str | None = None,
        problem_source: str | None = None,
    ) -> list[Proposal]:
        """Later rounds: answer the parent's bottleneck labels (its source and numbers when needed)."""
