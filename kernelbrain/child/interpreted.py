"""Triton's interpreter without its repeated patching: a kernel's calls of other @triton.jit functions
(a template's prologue and epilogue, tl.cumsum) run as fast as the kernel's own code.

Under TRITON_INTERPRET=1 a launch patches triton.language's builtins with their interpreted versions
(`_patch_lang`, which walks each module with inspect.getmembers), runs every program, and restores
them. A call of a @triton.jit function from inside a program patches the modules its own globals name
again, each call, and leaves them patched: a third of the interpreter's time on a template whose programs
call helpers. `fast_device_calls()` skips such a patch when the modules it would patch are already
patched in the launch that is running (by the launch itself, or by an earlier call in it, whose patches
Triton leaves in place): the same attributes, holding the same interpreted versions.

`no_dead_overflow_checks()` drops work whose result the interpreter throws away: every integer add, sub
and mul of a kernel also computes the operation in int64 and compares it with the type's range, to feed
a device assert that Triton emits only in debug mode, which its interpreter never is (so the check
changes no value and raises nothing). On the GPU the compiler leaves it out for the same reason. A sixth
of the interpreter's time on an index-heavy kernel (a transposed convolution's).
"""

from __future__ import annotations

import dataclasses
from typing import Any


def fast_device_calls() -> bool:
    """Install the skip (once per process); False where this Triton's interpreter is not the one it
    knows (then nothing changes)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    scope_class = getattr(interpreter, "_LangPatchScope", None)
    if patch is None or executor is None or scope_class is None:
        return False
    if getattr(patch, "_kb_once", False):
        return True
    # per launch running (launches do not nest; a list for safety): the modules patched in it so far,
    # None before the launch's own patch
    running: list[frozenset[int] | None] = []
    launch = executor.__call__

    def languages(fn: Any) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)

    def patch_once(fn: Any) -> Any:
        patched = running[-1] if running else None
        wanted = languages(fn)
        if patched is not None and wanted <= patched:
            return scope_class()  # nothing to patch, nothing to restore: a device call's scope is dropped
        scope = patch(fn)
        if running:
            running[-1] = wanted | (patched or frozenset())
        return scope

    def run_launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        running.append(None)
        try:
            return launch(self, *args, **kwargs)
        finally:
            running.pop()

    patch_once._kb_once = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_once
    executor.__call__ = run_launch
    return True


def no_dead_overflow_checks() -> bool:
    """Turn off the interpreter's overflow checks where its device asserts are off (see the module's
    docstring); False where this Triton's interpreter is not the one it knows (then nothing changes)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder: Any = getattr(interpreter, "interpreter_builder", None)
    options: Any = getattr(builder, "options", None)
    if "sanitize_overflow" not in getattr(options, "__dataclass_fields__", {}):
        return False
    if getattr(options, "debug", True):  # its asserts are live: the checks stay
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def fast_interpreter() -> None:
    """Both of this module's speed-ups, each where this Triton allows it: a child calls it before it
    runs any kernel."""
    fast_device_calls()
    no_dead_overflow_checks()
