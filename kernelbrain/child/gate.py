"""The candidate's side of the gate V(p), in its own child: the candidate compiles, matches the
signature, and obeys the policy while its forward runs on the judge's draws (kernelbrain/child/judge.py,
which holds the reference and the truth and compares the outputs written here)."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kernelbrain.child import guard, launchers, marks, memory, tensorfile
from kernelbrain.child.loading import (
    CandidateFault,
    construct,
    draw_digest,
    layout_copy,
    load_module,
    outputs,
    signature,
)
from kernelbrain.child.steps import Steps
from kernelbrain.core import handoff
from kernelbrain.core.protocol import Signature, TrialReply, TrialRequest


def _has_jit_kernel(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                if name == "jit":
                    return True
    return False


def _load_candidate(cand_source: str) -> ModuleType:
    try:
        tree = ast.parse(cand_source, "<candidate>")
    except SyntaxError as e:
        raise CandidateFault("compile", f"line {e.lineno}: {e.msg}") from e
    if not _has_jit_kernel(tree):
        raise CandidateFault(
            "policy", "no @triton.jit kernel: a candidate's work must be done by Triton kernels"
        )
    guard.install()
    launchers.record()
    try:
        return load_module(cand_source, "cand")
    except Exception as e:
        raise CandidateFault("compile", f"importing the candidate failed: {type(e).__name__}: {e}") from e


def _check_signature(want: Signature, cand: ModuleType) -> None:
    new_cls = getattr(cand, "ModelNew", None)
    if not inspect.isclass(new_cls) or not issubclass(new_cls, torch.nn.Module):
        raise CandidateFault("signature", "the candidate defines no class ModelNew(nn.Module)")
    for method in ("__init__", "forward"):
        names = want.init if method == "__init__" else want.forward
        got = [n for n, _ in signature(getattr(new_cls, method))]
        if names != got:
            raise CandidateFault(
                "signature",
                f"ModelNew.{method}({', '.join(got)}) differs from Model.{method}({', '.join(names)})",
            )


def _policy(check: Callable[..., None], *args: Any, prefix: str = "") -> None:
    try:
        check(*args)
    except guard.Violation as v:
        raise CandidateFault("policy", f"{prefix}{v}") from None


def _build(cand: ModuleType, entry: dict[str, Any], device: str) -> torch.nn.Module:
    """ModelNew(*init) given the reference's weights where its parameters match them."""
    new = construct(cand.ModelNew, entry["init"], device, eval_mode=entry["eval"])
    state, mine = entry["state"], new.state_dict()
    if state.keys() == mine.keys() and all(state[k].shape == mine[k].shape for k in state):
        new.load_state_dict(state)
    return new


def _running_state(new: torch.nn.Module, entry: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The running state the reference updates in training mode (the judge's `running` keys), each with a
    copy of the candidate's value as built: written after each call beside the outputs. A candidate that
    keeps none under a key the reference updates computes a different model."""
    state = new.state_dict()
    missing = [k for k in entry["running"] if k not in state]
    if missing:
        raise CandidateFault(
            "mismatch",
            f"ModelNew keeps no {', '.join(missing)}: the reference updates it in training mode "
            "(`kb run --eval` compares eval mode instead)",
        )
    return {k: state[k].detach().clone() for k in entry["running"]}


def _restart(new: torch.nn.Module, running: dict[str, torch.Tensor], where: str) -> None:
    """The candidate's running state put back as built; one it rebound to another shape, or dropped, is
    its fault."""
    state = new.state_dict(keep_vars=True)
    for k, start in running.items():
        try:
            state[k].data.copy_(start)
        except (KeyError, AttributeError, RuntimeError) as e:
            raise CandidateFault("runtime", f"{where}: its running state {k} cannot be reset ({e})") from None


def _kept(
    new: torch.nn.Module, running: dict[str, torch.Tensor], where: str, seed: int
) -> list[torch.Tensor]:
    """The candidate's running state after a call, for the judge beside its outputs."""
    state = new.state_dict()
    missing = [k for k in running if k not in state]
    if missing:
        raise CandidateFault("mismatch", f"{where}seed {seed}: ModelNew no longer keeps {', '.join(missing)}")
    return [state[k] for k in running]


def _drawn(path: Path, device: str) -> Any:
    """One of the judge's files. Only a candidate can spoil one (where the sandbox does not bind the
    judge's folder read-only), so one that does not read back is this candidate's doing."""
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except Exception as e:
        raise CandidateFault(
            "policy",
            f"the gate's file {path.name} no longer reads ({type(e).__name__}: {e}): it wrote over it",
        ) from None


# the latest problem's draws, for this child's next candidates
_HELD: dict[tuple[str, int, int], list[Any]] = {}


class _Draws:
    """The judge's draws as this child reads them: held between candidates within `keep_bytes` (a draw at
    a full-size shape is gigabytes to read again), and checked against the judge's digests each time
    they are used, so what an earlier candidate changed in memory is read from the file again."""

    def __init__(self, folder: str, prints: list[list[str]], keep_bytes: int, device: str) -> None:
        self.folder, self.prints, self.keep_bytes, self.device = folder, prints, keep_bytes, device
        if any(k[0] != folder for k in _HELD):
            _HELD.clear()

    def inputs(self, shape: int, seed: int) -> list[Any]:
        want = self.prints[shape][seed]
        key = (self.folder, shape, seed)
        held = _HELD.get(key)
        if held is not None and draw_digest(held) == want:
            return held
        _HELD.pop(key, None)
        path = handoff.inputs_file(self.folder, shape, seed)
        got: list[Any] = _drawn(path, self.device)
        if draw_digest(got) != want:
            raise CandidateFault("policy", f"the gate's file {path.name} changed after the judge wrote it")
        if _bytes(got) + sum(_bytes(v) for v in _HELD.values()) <= self.keep_bytes:
            _HELD[key] = got
        return got


def _bytes(inputs: list[Any]) -> int:
    return sum(x.untyped_storage().nbytes() for x in inputs if isinstance(x, torch.Tensor))


def trial(request: TrialRequest) -> TrialReply:
    """The candidate's side of V(p): it compiles, its signature matches, and its forward, run on each of
    the judge's draws under watch, obeys the policy; its outputs go to a file for the judge. A check it
    fails is the reply (no outputs), as a gate's verdict. `request.torch_ops`: the classes of torch ops
    its label lets it run (core/torch_ops.py), none by default."""
    try:
        draws = _Draws(request.folder, request.prints, request.keep_bytes, request.device)
        steps = Steps()
        launchers.forget()
        done = _trial(request, draws, steps)
        return TrialReply(folder=done, steps=steps.seconds, launchers=launchers.seen())
    except CandidateFault as f:
        return TrialReply(category=f.category, detail=f.detail)


def _trial(request: TrialRequest, draws: _Draws, steps: Steps) -> str:
    """The checks, one draw at a time; the folder of the outputs written."""
    timers = guard.timer_identities()
    cand = _load_candidate(request.cand_source)
    _policy(guard.check_untouched, None, {}, prefix="importing it: ")
    _check_signature(request.signature, cand)
    _policy(guard.check_timers, timers)
    steps.done("load")
    with marks.on_device():  # the worker holds the device from here (its compiles let go of it)
        _shapes(request, draws, steps, cand, timers)
    # after the last write too: what could still rewrite the outputs is a fault before the judge reads them
    _policy(guard.check_leftovers, prefix="after its last call: ")
    return str(Path(request.outbox))


def _shapes(
    request: TrialRequest, draws: _Draws, steps: Steps, cand: ModuleType, timers: dict[str, Any]
) -> None:
    """Each gate shape's draws through the candidate, checked, and its outputs written."""
    device, shapes, seeds, out = request.device, request.shapes, request.seeds, Path(request.outbox)
    # one draw in memory at a time: a gate shape at a problem's full size holds gigabytes a seed
    for i, (label, names) in enumerate(zip(shapes, request.forbidden, strict=True)):
        where = f"shape {label}, " if len(shapes) > 1 else ""
        marks.retake()
        entry = _drawn(handoff.init_file(draws.folder, i), device)
        try:
            new = _build(cand, entry, device)
        except Exception as e:
            if memory.out_of_memory(e):
                raise memory.verdict(e, "ModelNew(*get_init_inputs())") from e
            raise CandidateFault(
                "runtime", f"ModelNew(*get_init_inputs()) raised {type(e).__name__}: {e}"
            ) from e
        running = _running_state(new, entry)
        del entry
        steps.done("build")
        for seed in range(seeds):
            marks.retake()  # where a compile that raised let the device go
            _restart(new, running, f"{where}seed {seed}")  # each call from the state as built, as the judge's
            before = draws.inputs(i, seed)
            inputs = [layout_copy(x) for x in before]
            steps.done("inputs")
            with torch.no_grad():
                watch = guard.Watch(set(names), device, request.torch_ops)
                try:
                    with watch:
                        got = outputs(new(*inputs))
                        if device == "cuda":
                            torch.cuda.synchronize()
                except CandidateFault:
                    raise
                except Exception as e:
                    if memory.out_of_memory(e):  # the pool's fault, or the candidate's with the device free
                        raise memory.verdict(e, f"{where}seed {seed}: forward") from e
                    raise CandidateFault(
                        "runtime", f"{where}seed {seed}: forward raised {type(e).__name__}: {e}"
                    ) from e
                marks.retake()
                steps.done("first_forward" if i == seed == 0 else "forward")  # the first compiles
                _policy(watch.check, prefix=f"{where}seed {seed}: ")
                _policy(guard.check_untouched, None, {}, prefix=f"{where}seed {seed}: ")
                _policy(guard.check_timers, timers, prefix=f"{where}seed {seed}: ")
                _policy(guard.check_leftovers, prefix=f"{where}seed {seed}: ")
            for x, b in zip(inputs, before, strict=True):
                if isinstance(x, torch.Tensor) and not torch.equal(x, b):
                    raise CandidateFault("policy", f"{where}seed {seed}: the candidate mutated its inputs")
            _policy(guard.check_outputs, got, inputs, prefix=f"{where}seed {seed}: ")
            steps.done("checks")
            try:
                tensorfile.write(
                    handoff.outputs_file(out, i, seed), [*got, *_kept(new, running, where, seed)]
                )
            except tensorfile.Unreadable as e:
                raise CandidateFault("mismatch", f"{where}seed {seed}: {e}") from None
            del before, inputs, got
            steps.done("write")
