"""Triton's host-side launchers, built where no candidate code runs.

Triton 3.6 builds a small C launcher for each kernel signature with the host's C compiler (0.33 s on the
H200's host, experiments/launcher_probe.py) and keeps it in the Triton cache. Under bubblewrap a gate child's
cache is emptied for each candidate (a candidate's entries serve only its own source), so each candidate
paid for its launcher again. A launcher's code depends on nothing but the signature's argument types:
the gate child notes the signatures Triton made launchers for, the judge builds those with Triton's own
generator, and the worker keeps them for the children after (`kernelbrain.runtime.sandbox`). A signature
a candidate made up gets Triton's launcher for that signature, nothing of the candidate's.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

# an argument's type as Triton writes it in a signature: "*fp32", "i32", "constexpr", ...
_TYPE = re.compile(r"\*?k?[a-z]{1,4}\d{0,3}|constexpr")
MAX_ARGS = 128
MAX_PER_TRIAL = 4  # signatures a judge builds for one trial: a candidate cannot keep it compiling

_SEEN: list[list[Any]] = []  # the signatures this process's Triton made launchers for, since forget()


def forget() -> None:
    _SEEN.clear()


def seen() -> list[list[Any]]:
    """The signatures Triton made launchers for since forget(), in order."""
    return list(_SEEN)


def valid(signature: Any, depth: int = 0) -> bool:
    """A signature of argument types (tuples nest, as lists): no tensor descriptors, nothing else."""
    if not isinstance(signature, list | tuple) or len(signature) > MAX_ARGS or depth > 2:
        return False
    return all(
        (isinstance(t, str) and _TYPE.fullmatch(t) is not None) or valid(t, depth + 1) for t in signature
    )


def _as_triton(signature: list[Any]) -> list[Any]:
    return [tuple(_as_triton(t)) if isinstance(t, list) else t for t in signature]


def _as_json(signature: Any) -> Any:
    return [_as_json(t) for t in signature] if isinstance(signature, tuple | list) else signature


def _active() -> Any:
    """Triton's driver in this process, or None (the interpreter without a GPU has none)."""
    try:
        from triton.runtime import driver

        return driver.active
    except Exception:
        return None


def record(active: Any = None) -> None:
    """Note each signature Triton makes a launcher for, from now on in this process (before a candidate
    loads; the interpreter makes none)."""
    active = active or _active()
    made = getattr(active, "launcher_cls", None)
    if made is None or hasattr(made, "kb_original"):  # none to wrap, or wrapped already
        return

    def launcher(src: Any, metadata: Any, _made: Any = made) -> Any:
        signature = _as_json(list(getattr(src, "signature", {}).values()))
        if not getattr(metadata, "tensordesc_meta", None) and valid(signature):
            _SEEN.append(signature)
        return _made(src, metadata)

    launcher.kb_original = made  # type: ignore[attr-defined]
    active.launcher_cls = launcher


def build(signatures: list[Any]) -> dict:
    """Triton's launchers for these signatures, built into this process's Triton cache (the judge's):
    one already there is found, not built again."""
    return build_with(_active(), signatures)


def build_with(active: Any, signatures: list[Any]) -> dict:
    """build() with this driver (None: nothing is built). A signature whose launcher this Triton cannot
    make from the signature alone is left to each child."""
    made = getattr(active, "launcher_cls", None)
    if made is None:
        return {"built": 0}
    made = getattr(made, "kb_original", made)
    built = 0
    unique = {repr(s): s for s in signatures if valid(s)}
    for signature in list(unique.values())[:MAX_PER_TRIAL]:
        src = SimpleNamespace(
            signature=dict(enumerate(_as_triton(signature))), constants={}, fn=SimpleNamespace(arg_names=[])
        )
        metadata = SimpleNamespace(
            tensordesc_meta=None,
            num_ctas=1,
            global_scratch_size=0,
            global_scratch_align=1,
            profile_scratch_size=0,
            profile_scratch_align=1,
            launch_cooperative_grid=False,
            launch_pdl=False,
        )
        try:
            made(src, metadata)
        except Exception:  # a Triton whose launcher needs more than the signature: each child builds its own
            continue
        built += 1
    return {"built": built}
