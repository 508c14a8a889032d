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

from kernelbrain.templates.model_source import init_args

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


def parts_of(module: str, *names: str) -> str:
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


# kb's candidate API (kernelbrain/candidate.py), imported by the candidates whose parts use it
API_IMPORT = "from kernelbrain import candidate\n"
_USES_API = re.compile(r"(?<![\w.])candidate\.")


def module(doc: str, *sections: str) -> str:
    """A candidate module: its docstring, the header (and the candidate API's import where a part uses
    it), then each section a blank line apart."""
    body = "\n\n".join(s.strip("\n") for s in sections if s.strip())
    api = f"\n{API_IMPORT}" if _USES_API.search(body) else ""
    return f'"""{doc}"""\n\n{HEADER}{api}\n{body}\n'


def renamed(text: str, suffix: str, names: Iterable[str]) -> str:
    """`text` with every whole-word use of `names` suffixed: a second copy of parts (a kernel, its
    launcher, the chains it calls) that coexists with the first in one candidate module."""
    words = sorted(set(names), key=len, reverse=True)
    if not words:
        return text
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b")
    return pattern.sub(lambda m: m.group(1) + suffix, text)


def knob_text(knobs: dict[str, Any]) -> str:
    """A knob set as a candidate's docstring names it: `strategy=tile, block=1024`."""
    return ", ".join(f"{k}={v}" for k, v in knobs.items())


SUPER = "        super().__init__()\n"  # the body of a constructor that holds nothing of Model's


def model_class(init: str, body: str, forward: str, lines: str) -> str:
    """ModelNew's text: `__init__(<init>)` running `body`, then `forward(self, <forward>)` running
    `lines` (both lines indented for a method, each ending in a newline)."""
    head = f"class ModelNew(nn.Module):\n    def __init__({init}):\n{body}"
    return f"{head}\n    def forward(self, {forward}):\n{lines}"


def plain_init(signature: dict[str, list[str]], default: str = "=None") -> str:
    """`self, <Model.__init__'s parameters>` for a ModelNew that holds nothing of Model's: as declared
    where the analysis recorded them (model_source.init_args), else each name with `default`."""
    return "self" + init_args(signature, "".join(f", {a}{default}" for a in signature["init"]))


def plain_model(signature: dict[str, list[str]], lines: str, default: str = "=None") -> str:
    """ModelNew holding nothing of Model's (`plain_init`), its forward Model's parameters running `lines`."""
    return model_class(plain_init(signature, default), SUPER, ", ".join(signature["forward"]), lines)


def constructor_lines(spec: dict[str, Any], signature: dict[str, list[str]]) -> tuple[str, str]:
    """ModelNew's `__init__` parameters and body: Model's own where the spec holds them
    (model_source.with_constructor), else `plain_init`'s and a bare super().__init__()."""
    if "init_body" not in spec:
        return plain_init(signature), SUPER
    params = f"self, {spec['init_params']}" if spec["init_params"] else "self"
    return params, "".join(f"        {line}\n" for line in spec["init_body"].splitlines())


def refined_model(spec: dict[str, Any], signature: dict[str, list[str]], lines: str) -> str:
    """ModelNew running Model's constructor where the spec holds it (`constructor_lines`), its forward
    Model's parameters running `lines`."""
    return model_class(*constructor_lines(spec, signature), ", ".join(signature["forward"]), lines)


def init_with(signature: dict[str, list[str]], defaults: dict[str, str]) -> str:
    """`self, <Model.__init__'s parameters>` where the analysis did not record them: the names, those in
    `defaults` given that default, and every one after them None (a default needs defaults after it)."""
    out, defaulted = [], False
    for a in signature["init"]:
        if a in defaults:
            out.append(f"{a}={defaults[a]}")
            defaulted = True
        else:
            out.append(f"{a}=None" if defaulted else a)
    return "self" + init_args(signature, "".join(f", {a}" for a in out))


def model_attr(name: str) -> str:
    """ModelNew's parameter or buffer (Model's constructor run in it) by its state-dict name, as the
    attribute chain that reaches it: `bn.weight` -> `self.bn.weight`, `layers.0.weight` ->
    `self.layers[0].weight` (kb's candidate subset reads tensors of self so, with no lookup a call)."""
    return "self" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in name.split("."))


def tensor(what: list | None, names: list[str]) -> str:
    """The expression of forward that reads a tensor a spec names: ["input", i] by its name among
    `names` (forward's parameters), ["param", state-dict name] from ModelNew (`model_attr`), None as
    None."""
    if what is None:
        return "None"
    return names[what[1]] if what[0] == "input" else model_attr(str(what[1]))


def graph_doc(what: str, family: str, spec: dict[str, Any], knobs: dict[str, Any], how: str) -> str:
    """The docstring of a candidate composed from the traced graph: what it computes, the reference's
    ops, the family and its knobs, then how it computes it."""
    head = f"{what}: {', '.join(spec['ops'])}: kernelbrain {family} family ({knob_text(knobs)})."
    return f"{head}\n\n{how}, composed from the reference's ATen graph.\n"


# the dtype of a candidate's output where its inputs `xs` set it: theirs where they agree, else fp32 (in
# Python: torch.promote_types is an ATen call, which a candidate may not make)
PROMOTED = "xs[0].dtype if all(x.dtype == xs[0].dtype for x in xs) else torch.float32"


def dtype_of(dtype: str | None, otherwise: str) -> str:
    """A spec's dtype as the candidate writes it (torch.<dtype>), else the expression `otherwise`."""
    return f"torch.{dtype}" if dtype is not None else otherwise
