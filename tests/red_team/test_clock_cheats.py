"""Cheats on the bench's own witnesses, through a real sandboxed child: the in-process clock replaced by
a patch that puts the original back on its next read, the bench's list of samples edited through stack
frames, and the comparison of the timed calls' outputs turned off by a patch of a Tensor operator. The
bench's clocks are bound before candidate code loads, the worker holds the times the child reports
against its own clock around each timed batch (runtime/wall_clock.py), and the judge, where no candidate
code runs, compares the timed calls' outputs (child/kept.py).

The candidates here are passed as kb's own (`own_code`) where the worker's checks apply to both: what is
tested is what holds against code in the process, not the static checks that refuse such code up front
for a candidate from outside. The module's box shares one child (`fresh_untrusted` off)."""

from __future__ import annotations

import pytest

from kernelbrain.core.protocol import BenchReply, BenchRequest, DuelRequest
from kernelbrain.runtime.sandbox import Sandbox, SandboxFault
from tests.red_team.test_gate_cheats import SOFTMAX, softmax_cheat
from tests.red_team.test_timing_cheats import HONEST

# reads the clock as its call starts; its kernel sleeps 0.2 s; then the next read of time.perf_counter
# (the bench's, right after the call) gets the start time plus a microsecond, and the original is back
SELF_RESTORING_CLOCK = softmax_cheat(
    "real = time.perf_counter\n"
    "start = real()\n"
    "y = kernel_softmax(x, torch.empty_like(x))\n"
    "time.sleep(0.2)\n"
    "def fake():\n"
    "    time.perf_counter = real\n"
    "    return start + 1e-6\n"
    "time.perf_counter = fake\n"
    "return y"
)


def frames_edit(samples: str, value: str) -> str:
    """A candidate that sleeps 0.2 s a call and sets every sample so far in the bench's list `samples`
    (found up the stack) to `value`: the median is what it says, whatever the clock read."""
    return softmax_cheat(
        "y = kernel_softmax(x, torch.empty_like(x))\n"
        "time.sleep(0.2)\n"
        "frame = sys._getframe(1)\n"
        f"while frame is not None and {samples!r} not in frame.f_locals:\n"
        "    frame = frame.f_back\n"
        "if frame is not None:\n"
        f"    kept = frame.f_locals[{samples!r}]\n"
        f"    kept[:] = [{value}] * len(kept)\n"
        "return y"
    )


def bench(box: Sandbox, source: str) -> BenchReply:
    args = {"problem_source": SOFTMAX, "cand_source": source, "device": "cpu", "which": "smallest"}
    return box.call(BenchRequest(**args, repeats=3, warmup=1), timeout_s=300, own_code=True)[0]


def test_a_clock_patch_that_undoes_itself_never_reaches_the_bench(box: Sandbox) -> None:
    """The bench never reads the patched clock (its own is bound), so the patch is still in place when
    the reference is checked after the timing: refused there, not by the worker's clock."""
    with pytest.raises(SandboxFault) as caught:
        bench(box, SELF_RESTORING_CLOCK)
    fault = caught.value
    assert fault.category == "policy" and "replaced time.perf_counter" in fault.detail, fault


@pytest.mark.parametrize(
    ("samples", "value", "words"),
    [
        ("new_t", "1e-6", "cand: 1e-06 s a call in its process"),  # the candidate looks fast
        ("ref_t", "10.0", "ref: 10 s a call in its process"),  # the reference looks slow
    ],
)
def test_samples_edited_in_the_childs_process_disagree_with_the_workers_clock(
    box: Sandbox, samples: str, value: str, words: str
) -> None:
    with pytest.raises(SandboxFault) as caught:
        bench(box, frames_edit(samples, value))
    fault = caught.value
    assert fault.category == "policy" and "the worker's wall clock" in fault.detail, fault
    assert words in fault.detail, fault.detail


def test_an_honest_bench_agrees_with_the_workers_clock(box: Sandbox) -> None:
    (shape,) = bench(box, HONEST).shapes
    assert shape.wall_speedup is not None and shape.wall_speedup > 0, shape


# garbage whenever no torch function mode watches it (the gate's guard does), and `~` on a bool tensor
# made all False in its process: every comparison there that counts `a & ~close` elements passes
PATCHED_COMPARISON = softmax_cheat(
    "if torch._C._len_torch_function_stack() > 0:\n"
    "    return kernel_softmax(x, torch.empty_like(x))\n"
    "if not getattr(torch.Tensor.__invert__, 'patched', False):\n"
    "    invert = torch.Tensor.__invert__\n"
    "    def never(t):\n"
    "        return torch.zeros_like(t) if t.dtype == torch.bool else invert(t)\n"
    "    never.patched = True\n"
    "    torch.Tensor.__invert__ = never\n"
    "y = torch.empty_like(x)\n"
    "token_launch(y)\n"
    "return y.zero_()"
)


def test_a_comparison_patched_in_the_candidates_process_does_not_reach_the_judge(box: Sandbox) -> None:
    args = {
        "problem_source": SOFTMAX,
        "cand_source": PATCHED_COMPARISON,
        "device": "cpu",
        "which": "smallest",
    }
    request = BenchRequest(**args, repeats=3, warmup=1)
    # compared in its own process (as kb's own renders' are: a bench with no outbox), its zeros pass
    reply, _ = box.call(request, timeout_s=300, own_code=True)
    assert len(reply.shapes) == 1 and not reply.kept
    with pytest.raises(SandboxFault) as caught:  # from outside: compared in the judge
        box.call(request, timeout_s=300)
    fault = caught.value
    assert fault.category == "mismatch" and "timed call" in fault.detail, fault


def test_a_duel_sides_patched_comparison_does_not_reach_the_judge(box: Sandbox) -> None:
    """A duel's kept timed calls from outside are compared in the judge too, each side's."""
    args = {"problem_source": SOFTMAX, "device": "cpu", "which": "smallest", "repeats": 4, "warmup": 1}
    request = DuelRequest(**args, a_source=HONEST, b_source=PATCHED_COMPARISON)
    with pytest.raises(SandboxFault) as caught:
        box.call(request, timeout_s=300)
    fault = caught.value
    assert fault.category == "mismatch" and "candidate B, timed call" in fault.detail, fault
