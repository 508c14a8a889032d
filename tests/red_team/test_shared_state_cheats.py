"""Cheats that work through what a process shares between the candidates it runs, through real sandboxed
children: a patch of Triton's launcher that no check of torch's namespaces sees, so that every later
candidate's kernels never run. A candidate from outside gets a child that ran no other candidate, and
that child is stopped after its request: the next candidate never meets the patch."""

from __future__ import annotations

from pathlib import Path

from kernelbrain.core.protocol import GateReply, GateRequest
from kernelbrain.runtime.sandbox import Sandbox
from tests.red_team.test_gate_cheats import SOFTMAX

HERE = Path(__file__).resolve().parents[1]
HONEST = (HERE / "candidates" / "good_softmax.py").read_text()
# honest itself, but its module replaces the interpreter's launcher: only its own kernel runs after it
SABOTEUR = HONEST.replace("_softmax_kernel", "_saboteur_kernel") + (
    "\n\nfrom triton.runtime import interpreter as _interpreter\n"
    "_launch = _interpreter.GridExecutor.__call__\n\n\n"
    "def _only_mine(self, *args, **kwargs):\n"
    "    if self.fn.__name__ == '_saboteur_kernel':\n"
    "        return _launch(self, *args, **kwargs)\n\n\n"
    "_interpreter.GridExecutor.__call__ = _only_mine\n"
)


def gate(box: Sandbox, source: str) -> GateReply:
    request = GateRequest(problem_source=SOFTMAX, cand_source=source, device="cpu", seeds=3)
    return box.call(request, timeout_s=300)[0]


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_candidate_that_patches_triton_leaves_no_child_for_the_next_one() -> None:
    box = Sandbox("cpu")
    try:
        # as one shared child would have it: the honest candidate after the saboteur fails, its kernel
        # never ran (its outputs are the NaN-filled allocation)
        box.fresh_untrusted = False
        assert gate(box, SABOTEUR).passed
        shared = gate(box, HONEST)
        assert (shared.passed, shared.category) == (False, "nan"), shared
        assert box.proc is not None
        patched = box.proc.pid

        box.fresh_untrusted = True
        assert gate(box, SABOTEUR).passed  # in a child of its own: the patched one is stopped first
        assert not alive(patched)
        assert box.proc is None, "the child a candidate from outside ran in is stopped after it"
        assert box.spare is not None
        spare = box.spare.proc.pid
        assert alive(spare) and spare != patched

        honest = gate(box, HONEST)
        assert honest.passed, honest  # in the spare, which ran no candidate
        assert not alive(spare) and box.proc is None
        assert box.spare is not None and box.spare.proc.pid not in {patched, spare}
    finally:
        box.close()


def test_kbs_own_candidates_keep_sharing_a_warm_child() -> None:
    box = Sandbox("cpu")
    try:
        request = GateRequest(problem_source=SOFTMAX, cand_source=HONEST, device="cpu", seeds=3)
        assert box.call(request, timeout_s=300, own_code=True)[0].passed
        assert box.proc is not None
        warm = box.proc.pid
        assert box.call(request, timeout_s=300, own_code=True)[0].passed
        assert box.proc is not None and box.proc.pid == warm and box.spare is None
        # one from outside does not run where kb's own ran, and leaves nothing behind for them
        assert gate(box, HONEST).passed
        assert not alive(warm) and box.proc is None
    finally:
        box.close()
