"""The one renderer of composed candidates: a module made of the header every candidate has, the knob
constants, and parts copied as written from a kernels module of kb's (`@triton.jit` functions, their
Python launchers, constants), read from its file with `ast`: the generator never imports Triton."""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterable
from functools import cache
from typing import Any

HEADER = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"


@cache
def _top_level(module: str) -> dict[str, str]:
    """A module's top-level functions and assignments by name, each as its source with decorators."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {module}")
    with open(spec.origin) as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    out: dict[str, str] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            name = node.name
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        assert node.end_lineno is not None
        out[name] = "".join(lines[first - 1 : node.end_lineno])
    return out


def parts(module: str, *names: str) -> str:
    """The named parts of `module`, in the order given, a blank line apart."""
    found = _top_level(module)
    missing = [n for n in names if n not in found]
    if missing:
        raise KeyError(f"{module} has no {', '.join(missing)}")
    return "\n\n".join(found[n].rstrip() for n in names) + "\n"


def constants(**values: Any) -> str:
    """Module constants from knobs: `BLOCK = 1024`, one a line, as Python reads them back."""
    return "".join(f"{name} = {value!r}\n" for name, value in values.items())


def chain(name: str, lines: list[str], result: str, params: str = "v0, v1, v2, v3") -> str:
    """A `@triton.jit` function of `params` emitted from a traced graph's elementwise chain (the
    pointwise table's lines, one assignment each), returning `result`: the one generated Triton text."""
    body = "".join(f"    {line}\n" for line in lines)
    return f"@triton.jit\ndef {name}({params}):\n{body}    return {result}\n"


def module(doc: str, *sections: str) -> str:
    """A candidate module: its docstring, the header, then each section a blank line apart."""
    body = "\n\n".join(s.strip("\n") for s in sections if s.strip())
    return f'"""{doc}"""\n\n{HEADER}\n{body}\n'


def renamed(text: str, suffix: str, names: Iterable[str]) -> str:
    """`text` with every whole-word use of `names` suffixed: a second copy of parts (a kernel, its
    launcher, the chains it calls) that coexists with the first in one candidate module."""
    words = sorted(set(names), key=len, reverse=True)
    if not words:
        return text
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b")
    return pattern.sub(lambda m: m.group(1) + suffix, text)
