"""The check every composed family's tests make: each knob set the search can reach renders a candidate
built from the family's `*_parts` module, its functions as written there.

Why: a composed family keeps its kernels as real `@triton.jit` functions that ruff and the tests see; a
render that spliced a string, left a placeholder or edited a copy would ship code nothing has checked.
One helper keeps that check, and the way the reachable knob sets are collected, the same for all."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

Knobs = dict[str, Any]


class Searchable(Protocol):
    """What the search walks: round 0 and the moves that make children of a knob set."""

    ROUND0: list[Knobs]
    MUTATIONS: dict[str, list[tuple[str, str]]]

    def mutate(self, knobs: Knobs, move: str) -> Knobs | None: ...


def reachable_knobs(family: Searchable, depth: int | None = 1) -> list[Knobs]:
    """Round 0 and every knob set at most `depth` mutations away from it (None: any number), each once,
    nearest first."""
    out: list[Knobs] = []
    for knobs in family.ROUND0:
        if knobs not in out:
            out.append(knobs)
    frontier, step = list(out), 0
    while frontier and (depth is None or step < depth):
        step += 1
        found: list[Knobs] = []
        for knobs in frontier:
            for moves in family.MUTATIONS.values():
                for move, _ in moves:
                    child = family.mutate(knobs, move)
                    if child is not None and child not in out:
                        out.append(child)
                        found.append(child)
        frontier = found
    return out


@dataclass(frozen=True)
class Composition:
    """The top-level functions a rendered candidate defines, by name, and those among them that are
    kernels."""

    functions: frozenset[str]
    kernels: frozenset[str]


def is_kernel(fn: ast.FunctionDef) -> bool:
    """Decorated `@triton.jit` or `@triton.jit(...)` (as with `do_not_specialize=`)."""
    names = [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list]
    return "triton.jit" in names


def top_level_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """A module's top-level functions by name."""
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


@functools.cache
def parts_functions(parts_module: str) -> dict[str, str]:
    """The parts module's top-level functions by name, each as its syntax tree dumped (formatting and
    comments aside); its file is read, not imported, as the generator reads it."""
    spec = importlib.util.find_spec(parts_module)
    assert spec is not None and spec.origin is not None, parts_module
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    return {name: ast.dump(fn) for name, fn in top_level_functions(tree).items()}


def assert_composed_of_parts(
    source: str, parts_module: str, context: object = None, also: tuple[str, ...] = ()
) -> Composition:
    """`source` parses, holds no "@KNOB"-style placeholder, defines at least one kernel and none but at
    the top level, and every top-level function it defines (kernel or launcher) is, by syntax tree, the
    parts module's function of that name (or, for a name it lacks, that of a module in `also`: the
    shared pointwise helpers). `context` (the knob set, say) goes into each failure's message. Returns
    what it defines, for a test's own checks."""
    where = "" if context is None else f" ({context})"
    assert re.search(r"@[A-Z]", source) is None, f"a placeholder left in the candidate{where}"
    ours = top_level_functions(ast.parse(source))
    kernels = frozenset(name for name, fn in ours.items() if is_kernel(fn))
    assert kernels, f"no kernel in the candidate{where}"
    # no kernel hides anywhere but at the top level (in a class, a string)
    assert len(re.findall(r"@triton\.jit\b", source)) == len(kernels), f"a kernel not at the top{where}"
    theirs = {k: v for module in reversed((parts_module, *also)) for k, v in parts_functions(module).items()}
    for name, fn in ours.items():
        assert name in theirs, f"{name} is not a function of {parts_module} nor {also}{where}"
        assert ast.dump(fn) == theirs[name], f"{name} differs from {parts_module}'s{where}"
    return Composition(functions=frozenset(ours), kernels=kernels)
