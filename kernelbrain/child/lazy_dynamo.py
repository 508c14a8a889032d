"""torch's dynamo-disabled functions called plainly while torch._dynamo is not loaded.

Many of torch's Python functions (the reference implementations behind arithmetic on the meta device,
among them) are wrapped by `torch._compile._disable_dynamo`, whose wrapper imports torch._dynamo on its
first call to build the disabled version: 1.4-1.7 s of a CPU core, and most of a CPU judge's start, which
sizes inputs and traces the reference on meta. Where dynamo is not loaded nothing can be compiling, so
the disabled version and the function itself do the same. `install()` gives each such wrapper a stand-in
for the disabled version it caches (the attribute it reads) that calls the function itself, and, once
torch._dynamo is loaded by anything, steps aside for torch's own wrapper: the real disabled version is
built then, as torch would have built it. No import of torch._dynamo is kb's or a candidate's doing then
that was not before; only those that meta arithmetic made are gone.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Callable
from typing import Any

_ATTR = "__dynamo_disable"  # where torch's wrapper caches the disabled version of its function
_installed = False


def _wrapper_code() -> types.CodeType | None:
    """The code of torch's wrapper, where it is the one this module knows: it reads and writes `_ATTR`
    on its function `fn`."""
    try:
        import torch._compile
    except ImportError:
        return None
    outer = getattr(torch._compile, "_disable_dynamo", None)
    for const in getattr(getattr(outer, "__code__", None), "co_consts", ()):
        if (
            isinstance(const, types.CodeType)
            and const.co_name == "inner"
            and "fn" in const.co_freevars
            and _ATTR in const.co_consts
            and _ATTR in const.co_names
        ):
            return const
    return None


def _stand_in(fn: Any, wrapper: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None or not hasattr(dynamo, "disable"):  # not loaded (or still loading): not compiling
            return fn(*args, **kwargs)
        if getattr(fn, _ATTR, None) is call:
            delattr(fn, _ATTR)  # torch's wrapper builds and caches the real one
        return wrapper(*args, **kwargs)

    return call


def install() -> int:
    """Give every dynamo-disabled function of torch's loaded so far its stand-in (once per process);
    how many. Nothing where torch._dynamo is loaded already or torch's wrapper is not the one known."""
    global _installed
    if _installed or "torch._dynamo" in sys.modules:
        return 0
    _installed = True
    code = _wrapper_code()
    if code is None:
        return 0
    at = code.co_freevars.index("fn")
    done = 0
    for obj in gc.get_objects():
        if type(obj) is types.FunctionType and obj.__code__ is code and obj.__closure__ is not None:
            fn = obj.__closure__[at].cell_contents
            if getattr(fn, _ATTR, None) is None:
                setattr(fn, _ATTR, _stand_in(fn, obj))
                done += 1
    return done
