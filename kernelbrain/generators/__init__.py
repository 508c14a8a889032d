"""Candidate generators. `get(name)` builds one; each is a small `Generator` subclass."""

from typing import Any

from kernelbrain.generators.base import GenerationError, Generator, Proposal, Unavailable

GENERATORS = ("expert", "llm")


def get(name: str, **options: Any) -> Generator:
    if name == "expert":
        # imports every template family: only in the processes that generate (not every `kb` command)
        from kernelbrain.generators.expert import ExpertGenerator

        return ExpertGenerator(**options)
    if name == "llm":
        from kernelbrain.generators.llm import LLMGenerator  # imports httpx: only in the runs that use it

        return LLMGenerator(**options)
    raise GenerationError(f"unknown generator {name!r}; choose one of: {', '.join(GENERATORS)}")


__all__ = ["GENERATORS", "GenerationError", "Generator", "Proposal", "Unavailable", "get"]
