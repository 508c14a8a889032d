"""Candidate generators. `get(name)` builds one; each is a small `Generator` subclass."""

from kernelbrain.generators.base import GenerationError, Generator, Proposal
from kernelbrain.generators.expert import ExpertGenerator

GENERATORS: dict[str, type[Generator]] = {"expert": ExpertGenerator}


def get(name: str) -> Generator:
    if name not in GENERATORS:
        raise GenerationError(f"unknown generator {name!r}; choose one of: {', '.join(GENERATORS)}")
    return GENERATORS[name]()


__all__ = ["GENERATORS", "GenerationError", "Generator", "Proposal", "get"]
