"""Cheats that work through what a process shares between the candidates it runs, through real sandboxed
children: a patch of Triton's launcher that no check of torch's namespaces sees, so that every later
candidate's kernels never run (a candidate from outside gets a child that ran no other candidate, and
that child is stopped after its request: the next candidate never meets the patch); and in a duel,
where two candidates share one process by design, a side that slows its rival."""

from __future__ import annotations

from pathlib import Path

import pytest
from kernelbrain.store import EventStore

from kernelbrain.core.protocol import DuelReply, DuelRequest, DuelShape, GateReply, GateRequest
from kernelbrain.runtime.role import Task
from kernelbrain.runtime.roles.benchmarker import BenchmarkerRole
from kernelbrain.runtime.roles.gatekeeper import GatekeeperRole
from kernelbrain.runtime.sandbox import Sandbox, SandboxFault
from tests.red_team.test_gate_cheats import SOFTMAX
from tests.runs import SyntheticRun

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


def gate(box: Sandbox, source: str, own_code: bool = False, spare: bool = True) -> GateReply:
    request = GateRequest(problem_source=SOFTMAX, cand_source=source, device="cpu", seeds=1)
    return box.call(request, timeout_s=300, own_code=own_code, spare=spare)[0]


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_candidate_that_patches_triton_leaves_no_child_for_the_next_one(box: Sandbox) -> None:
    box.fresh_untrusted = True  # the module's shared box, as a worker's is
    try:
        # kb's own candidates share a warm child: were the saboteur one of them, the honest candidate
        # after it would fail, its kernel never run (its outputs are the NaN-filled allocation)
        assert gate(box, SABOTEUR, own_code=True).passed
        assert box.proc is not None
        patched = box.proc.pid
        shared = gate(box, HONEST, own_code=True)
        assert (shared.passed, shared.category) == (False, "nan"), shared
        assert box.proc is not None and box.proc.pid == patched, "kb's own candidates share a child"

        assert gate(box, SABOTEUR).passed  # from outside: a child of its own, the patched one stopped
        assert not alive(patched)
        assert box.proc is None, "the child a candidate from outside ran in is stopped after it"
        assert box.spare is not None
        spare = box.spare.proc.pid
        assert alive(spare) and spare != patched

        honest = gate(box, HONEST)
        assert honest.passed, honest  # in the spare, which ran no candidate
        assert not alive(spare) and box.proc is None
        assert box.spare is not None and box.spare.proc.pid not in {patched, spare}

        # the last candidate from outside (no other waits): it takes the spare, and none is started
        last = box.spare.proc.pid
        assert gate(box, HONEST, spare=False).passed
        assert not alive(last) and box.proc is None and box.spare is None
    finally:
        box.fresh_untrusted = False


def test_a_spare_child_is_wanted_only_while_another_candidate_from_outside_waits() -> None:
    """The roles start a spare child (an import of torch and Triton) for a candidate from outside only
    where another such candidate will need one: the gatekeeper while another waits for the gate, the
    benchmarker while another's work is not done; the last one's spare would be imported for nothing."""
    with EventStore(":memory:") as store:
        run = SyntheticRun(store)
        for cid in ("a", "b"):
            run.propose(cid)
        keeper, bencher = GatekeeperRole(store), BenchmarkerRole(store)
        gate_a, bench_a = Task("r/gate/a", "a"), Task("r/bench/0/a", "a", 0)
        assert keeper.spare_wanted(gate_a, run.state())  # b waits for the gate
        run.gate("b", ok=False)
        state = run.state()
        assert not keeper.spare_wanted(gate_a, state)  # b was judged: a is the gate's last
        assert not bencher.spare_wanted(bench_a, state)  # b's work is done: a is the last
        run.propose("c")
        run.gate("c")
        assert bencher.spare_wanted(bench_a, run.state())  # c's rungs are still to run
        assert not keeper.spare_wanted(gate_a, run.state())


# a duel's side A that slows its rival B: torch.empty_like, which B allocates its output with, sleeps
# for every caller but A's own module
SLOWS_ITS_RIVAL = HONEST.replace("_softmax_kernel", "_rival_kernel") + (
    "\n\nimport sys as _sys\nimport time as _time\n\n_empty_like = torch.empty_like\n\n\n"
    "def _slow_for_others(*args, **kwargs):\n"
    "    if _sys._getframe(1).f_globals is not globals():\n"
    "        _time.sleep(0.3)\n"
    "    return _empty_like(*args, **kwargs)\n\n\n"
    "torch.empty_like = _slow_for_others\n"
)


def test_a_duel_side_that_slows_its_rival_is_refused(box: Sandbox) -> None:
    """The duel is checked like a rung, both sides: what either loaded is checked against torch as it
    was, after both load and after the timing. Its fault means no verdict (runtime/roles/benchmarker.py:
    a tie, `Adjudicated.detail` saying why)."""
    args = {"problem_source": SOFTMAX, "device": "cpu", "which": "smallest", "repeats": 4, "warmup": 1}
    with pytest.raises(SandboxFault) as caught:
        box.call(DuelRequest(**args, a_source=HONEST, b_source=SLOWS_ITS_RIVAL), timeout_s=300)
    assert caught.value.category == "policy" and "empty_like" in caught.value.detail, caught.value


def test_a_duel_side_slower_than_in_its_own_rung_gives_no_verdict() -> None:
    """A side that ran slower beside its rival than in its own rung (timed in a process its rival never
    ran in), past the reference's drift bound: its rival slowed it in a way no check saw (a patch that
    undoes itself before the checks), and the duel decides nothing."""
    with EventStore(":memory:") as store:
        run = SyntheticRun(store)
        for cid in ("a", "b"):
            run.propose(cid)
            run.gate(cid)
            run.bench(cid, 0, 2.0)  # 0.5 s a call in its own rung
        state = run.state()
    task = Task("r/adjudicate/0/a/b", "a", 0, rival="b")

    def reply(a_s: float, b_s: float) -> DuelReply:
        shape = DuelShape(shape="default", calls=1, a_median_s=a_s, a_iqr_s=0.0, b_median_s=b_s, b_iqr_s=0.0)
        return DuelReply(ratios=[a_s / b_s] * 12, timer="interpreter-wallclock", shapes=[shape])

    assert BenchmarkerRole.slowed(state, task, reply(0.4, 0.6)) is None  # within the CPU's 10x + 0.5 s
    slowed = BenchmarkerRole.slowed(state, task, reply(0.5, 12.0))
    assert slowed is not None and slowed.startswith("b ran 24.00x slower beside a"), slowed
    assert BenchmarkerRole.slowed(state, task, reply(9.0, 0.5)) is not None
