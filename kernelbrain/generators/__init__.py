"""Candidate generators. `get(name)` builds one; each is a small `Generator` subclass."""

from typing import Any

from kernelbrain.generators.base import GenerationError, Generator, Proposal, Unavailable
from kernelbrain.generators.expert import ExpertGenerator
from kernelbrain.generators.llm import LLMGenerator

GENERATORS: dict[str, type[Generator]] = {"expert": ExpertGenerator, "llm": LLMGenerator}


def get(name: str, **options: Any) -> Generator:
    if name not in GENERATORS:
        raise GenerationError(f"unknown generator {name!r}; choose one of: {', '.join(GENERATORS)}")
    return GENERATORS[name](**options)


__all__ = ["GENERATORS", "GenerationError", "Generator", "Proposal", "Unavailable", "get"]
