"""kb's own code in a child, and the standard library its checks run on, as they were before a candidate
loaded: a candidate runs in the same interpreter as the checks that judge it, and one that replaced
`Watch.check`, rebound a function's `__code__`, emptied a policy set or swapped `builtins.sorted` would
turn a check off. `changed()` names what moved since `snapshot()`.

This raises the bar; it is no wall. Code that runs in this process can reach the snapshot itself
(through gc), so what must hold against a candidate written for kb's internals is decided elsewhere:
the judge's comparison of values, the judge's clean reference time, the sandbox (docs/architecture.md,
the threat model).
"""

from __future__ import annotations

import sys
import types
from typing import Any

# the standard library and the libraries kb's checks and replies are made with
LIBRARIES = (
    "builtins",
    "threading",
    "inspect",
    "ast",
    "gc",
    "secrets",
    "time",
    "os",
    "signal",
    "copy",
    "hashlib",
    "math",
    "statistics",
    "struct",
    "json",
    "orjson",
    "pydantic",
    "pydantic.main",
)
_CONSTANT = (str, int, float, bool, bytes, tuple, frozenset, type(None))
_CONTAINER = (set, list, dict)
_DUNDERS = ("__init__", "__call__", "__enter__", "__exit__", "__torch_function__", "__torch_dispatch__")


def _own(module_name: str) -> bool:
    return module_name == "kernelbrain" or module_name.startswith("kernelbrain.")


def _cells(fn: types.FunctionType) -> tuple:
    """The identities of what a function's closure holds (None for an empty cell)."""
    out = []
    for cell in fn.__closure__ or ():
        try:
            out.append(id(cell.cell_contents))
        except ValueError:  # an empty cell
            out.append(None)
    return tuple(out)


def _function(found: dict[str, tuple[Any, Any]], name: str, fn: types.FunctionType) -> None:
    found[name] = (fn, None)
    found[f"{name}.__code__"] = (fn.__code__, None)
    found[f"{name}.__defaults__"] = (fn.__defaults__, None)
    found[f"{name}.__kwdefaults__"] = (None, _frozen(fn.__kwdefaults__ or {}))
    found[f"{name}.__closure__"] = (None, _cells(fn))


def _value(found: dict[str, tuple[Any, Any]], name: str, value: Any, own: bool, depth: int = 0) -> None:
    raw = value.__func__ if isinstance(value, staticmethod | classmethod) else value
    if isinstance(raw, types.FunctionType):
        _function(found, name, raw)
    elif isinstance(raw, property):
        found[name] = (raw, None)
        for part in ("fget", "fset"):
            if isinstance(getattr(raw, part), types.FunctionType):
                _function(found, f"{name}.{part}", getattr(raw, part))
    elif isinstance(raw, type) and own and _own(raw.__module__) and depth == 0:
        found[name] = (raw, None)
        for attr, member in list(vars(raw).items()):
            method = callable(member) or isinstance(member, staticmethod | classmethod | property)
            if method and (not attr.startswith("__") or attr in _DUNDERS):
                _value(found, f"{name}.{attr}", member, own, depth + 1)
    elif callable(raw) or isinstance(raw, types.ModuleType):
        found[name] = (raw, None)
    elif own and _public_constant(name.rsplit(".", 1)[-1]):  # a policy set, a limit
        if isinstance(raw, _CONSTANT):
            found[name] = (raw, None)
        elif isinstance(raw, _CONTAINER):
            found[name] = (raw, _frozen(raw))


def _public_constant(attr: str) -> bool:
    return attr.isupper() and not attr.startswith("_")


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((repr(k), id(v)) for k, v in value.items())
    if isinstance(value, set):
        return frozenset(value)
    return tuple(id(v) for v in value)


def snapshot() -> dict[str, tuple[Any, Any]]:
    """Every function (with its code, defaults and closure), class method, module and constant of kb's
    modules loaded now, and the callables of the libraries above."""
    found: dict[str, tuple[Any, Any]] = {}
    for name, module in list(sys.modules.items()):
        own = _own(name)
        if (not own and name not in LIBRARIES) or module is None:
            continue
        found[f"sys.modules[{name}]"] = (module, None)
        for attr, value in list(vars(module).items()):
            if not attr.startswith("__"):
                _value(found, f"{name}.{attr}", value, own)
    return found


def changed(before: dict[str, tuple[Any, Any]]) -> list[str]:
    """What moved since `before`, in its order: an object replaced or removed, a container's contents
    changed. Nothing here calls what it checks (builtins.sorted replaced would return nothing)."""
    now = snapshot()
    moved = []
    for name, (obj, frozen) in before.items():
        got = now.get(name)
        if got is None or got[0] is not obj or got[1] != frozen:
            moved.append(name)
    return moved
