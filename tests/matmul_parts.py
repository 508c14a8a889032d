"""Checks the gemv and gemm_epilogue tests share: a rendered candidate is composed of its parts module's
functions as written, with no placeholder left, for every knob set the search reaches from round 0."""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any


def reachable(
    round0: list[dict[str, Any]], mutations: dict, mutate: Callable[[dict[str, Any], str], Any]
) -> list[dict[str, Any]]:
    """The round-0 knob sets and every one a single mutation makes of them."""
    out = list(round0)
    for knobs in round0:
        for moves in mutations.values():
            for move, _ in moves:
                child = mutate(knobs, move)
                if child is not None and child not in out:
                    out.append(child)
    return out


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _jitted(fn: ast.FunctionDef) -> bool:
    """Decorated `@triton.jit` or `@triton.jit(...)`."""
    names = [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list]
    return "triton.jit" in names


def assert_composed_of_parts(source: str, parts_module: str) -> None:
    """`source` parses, holds no "@KNOB"-style placeholder, and every top-level function it defines (each
    `@triton.jit` kernel and each launcher) is, statement for statement, the parts module's own."""
    assert re.search(r"@[A-Z]", source) is None, "a placeholder left in the candidate"
    spec = importlib.util.find_spec(parts_module)
    assert spec is not None and spec.origin is not None
    theirs = _functions(ast.parse(Path(spec.origin).read_text()))
    ours = _functions(ast.parse(source))
    kernels = [name for name, fn in ours.items() if _jitted(fn)]
    assert kernels, "no kernel in the candidate"
    # no kernel hides anywhere but at the top level (in a class, a string)
    assert len(re.findall(r"@triton\.jit\b", source)) == len(kernels)
    for name, fn in ours.items():
        assert name in theirs, f"{name} is not a function of {parts_module}"
        assert ast.dump(fn) == ast.dump(theirs[name]), f"{name} differs from {parts_module}'s"
