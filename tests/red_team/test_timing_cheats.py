"""Cheats aimed at the timed calls rather than the gate, through a real sandboxed child: a candidate
that behaves only while watched (the gate runs under torch's mode stack, the timed calls do not) and
keeps results by input address. The benchmark changes the inputs' contents in place between samples
and checks the outputs of timed calls it picks afterwards, so the kept results are wrong answers."""

from __future__ import annotations

import pytest

from kernelbrain.core.protocol import BenchRequest, GateRequest
from kernelbrain.runtime.sandbox import SandboxFault
from tests.red_team.test_gate_cheats import SOFTMAX, softmax_cheat

WATCHED_ONLY = softmax_cheat(
    "watched = torch._C._len_torch_function_stack() > 0\n"
    "if not watched and x.data_ptr() in self.kept:\n"
    "    token_launch(torch.empty(1))\n"
    "    return self.kept[x.data_ptr()]\n"
    "y = kernel_softmax(x, torch.empty_like(x))\n"
    "if not watched:\n"
    "    self.kept[x.data_ptr()] = y\n"
    "return y",
    init="self.kept = {}",
)
HONEST = softmax_cheat("y = torch.empty_like(x)\nreturn kernel_softmax(x, y)")


def bench_fault(box, source: str, own_code: bool = False) -> SandboxFault:
    """The candidate's failed check when its benchmark is run (it must fail one)."""
    with pytest.raises(SandboxFault) as caught:
        bench(box, source, own_code=own_code)
    return caught.value


def bench(box, source: str, repeats: int = 6, own_code: bool = False):
    args = {"problem_source": SOFTMAX, "cand_source": source, "device": "cpu", "which": "smallest"}
    return box.call(BenchRequest(**args, repeats=repeats, warmup=1), timeout_s=300, own_code=own_code)[0]


# code from outside: its kept timed calls checked in the judge after the timing; kb's own (a template
# with a bug that showed only unwatched): each checked in its child as soon as it returned
@pytest.mark.parametrize("own_code", [False, True], ids=["from-outside", "kb-own"])
def test_a_cheat_that_behaves_only_while_watched_passes_the_gate_and_fails_the_timed_calls(
    box, own_code: bool
) -> None:
    gate = box.call(
        GateRequest(problem_source=SOFTMAX, cand_source=WATCHED_ONLY, device="cpu", seeds=3), timeout_s=300
    )
    assert gate[0].passed is True, gate  # the gate alone cannot see it
    raised = bench_fault(box, WATCHED_ONLY, own_code)
    assert raised is not None and getattr(raised, "category", None) == "mismatch", raised
    assert "timed call" in raised.detail and "earlier call" in raised.detail, raised.detail


def test_an_honest_kernel_passes_the_checked_timed_calls(box) -> None:
    r = bench(box, HONEST)
    assert len(r.shapes) == 1 and r.shapes[0].cand_median_s > 0


# keyed on the values of the first 4 elements: the three rotated draws alone would give it a hit on
# every call after the third, each the right answer; mixed subsets make the hits stale (a subset starts
# among those 4 about 1 time in 25, a miss that computes honestly)
CONTENT_KEYED = softmax_cheat(
    "watched = torch._C._len_torch_function_stack() > 0\n"
    "key = None if watched else tuple(x.reshape(-1)[:4].tolist())\n"
    "if key in self.kept:\n"
    "    token_launch(torch.empty(1))\n"
    "    return self.kept[key]\n"
    "y = kernel_softmax(x, torch.empty_like(x))\n"
    "if key is not None:\n"
    "    self.kept[key] = y.clone()\n"
    "return y",
    init="self.kept = {}",
)


def test_a_cache_keyed_on_part_of_the_contents_fails_the_timed_calls(box) -> None:
    gate = box.call(
        GateRequest(problem_source=SOFTMAX, cand_source=CONTENT_KEYED, device="cpu", seeds=3),
        timeout_s=300,
    )
    assert gate[0].passed is True, gate
    raised = bench_fault(box, CONTENT_KEYED)
    assert raised is not None and getattr(raised, "category", None) == "mismatch", raised
    assert "timed call" in raised.detail, raised.detail


def test_no_two_calls_see_the_same_inputs_and_each_is_rebuilt_exactly() -> None:
    import torch

    from kernelbrain.child.loading import Problem
    from kernelbrain.child.timing import Rotation

    r = Rotation(Problem(SOFTMAX), {"batch_size": 8, "dim": 200}, "cpu", 100)
    assert r.use_slots(5) == 5
    seen = []
    for i in range(6):
        r.load(i)
        for _ in range(5):
            (x,) = r.next()
            seen.append(x.clone())
            assert torch.equal(x, r.inputs(r.current, r.last_mix())[0])
    addresses = {x.data_ptr() for slot in r.slots for x in slot}
    assert len(addresses) == 5  # the same five tensors, refilled
    distinct = {tuple(x.reshape(-1).tolist()) for x in seen}
    assert len(distinct) == len(seen)
    # each differs from its plain draw in a strided subset only
    (x,) = r.slots[0]
    plain = r.sets[r.current][0]
    changed = int((x != plain).sum())
    assert x.numel() // 128 <= changed <= x.numel() // 61 + 1


def test_the_benchmark_still_guards_the_reference_it_times_beside_the_candidate(box) -> None:
    """The benchmark's child holds both (the ratio is timed side by side): a candidate's __init__ that
    zeroes the reference's weights through gc, or replaces Model.forward, is caught there."""
    from tests.red_team.test_gate_cheats import CHEATS

    for name, words in (
        ("the reference's weights zeroed through gc", "reference model's weights"),
        ("Model.forward replaced from __init__", "Model.forward"),
    ):
        problem, source, _, _ = CHEATS[name]
        args = {"problem_source": problem, "cand_source": source, "device": "cpu", "which": "smallest"}
        try:
            box.call(BenchRequest(**args, repeats=3, warmup=1), timeout_s=300)
            raised = None
        except Exception as e:
            raised = e
        assert raised is not None and getattr(raised, "category", None) == "policy", (name, raised)
        assert words in raised.detail, (name, raised.detail)


# slows the reference between its own timed calls with a patch that undoes itself once the reference
# ran through it, and leaves none in place where the benchmark checks torch (after its first call and
# after its last): the reference's time beside it is a lie only the clean child's time shows
SELF_RESTORING = softmax_cheat(
    "self.calls += 1\n"
    "if 1 < self.calls < self.last:\n"
    "    original = torch.softmax\n"
    "    def slow(*a, **k):\n"
    "        torch.softmax = original\n"
    "        time.sleep(1.0)\n"
    "        return original(*a, **k)\n"
    "    torch.softmax = slow\n"
    "return kernel_softmax(x, torch.empty_like(x))",
    init="self.calls = 0\nself.last = 8  # compile, one warmup, six timed",
)


def test_a_reference_slowed_by_a_self_restoring_patch_is_caught_by_its_clean_time(box) -> None:
    try:
        bench(box, SELF_RESTORING, repeats=6)
        raised = None
    except Exception as e:
        raised = e
    assert raised is not None and getattr(raised, "category", None) == "policy", raised
    assert "slower beside the candidate" in raised.detail, raised.detail


def test_the_clean_time_is_recorded_beside_the_ratio(box) -> None:
    (shape,) = bench(box, HONEST).shapes
    assert shape.ref_alone_median_s is not None and shape.ref_alone_median_s > 0


# kb's check of the kept timed calls turned off from inside the candidate, and results cached across
# calls: a 100x "speedup" if the check were gone
UNCHECKED = softmax_cheat(
    "if self.cache is None or torch._C._len_torch_function_stack() > 0:\n"
    "    self.cache = kernel_softmax(x, torch.empty_like(x))\n"
    "    return self.cache\n"
    "token_launch(torch.empty(1))\n"
    "return self.cache",
    init="self.cache = None",
    top="_timing = sys.modules.get('kernelbrain.child.timing')\n"
    "if _timing is not None:\n"
    "    _timing._check_kept = lambda *a, **k: None\n",
)


def test_a_candidate_that_turns_off_the_timed_calls_check_fails_the_benchmark(box) -> None:
    raised = bench_fault(box, UNCHECKED)
    assert raised is not None and getattr(raised, "category", None) == "policy", raised
    assert "kernelbrain.child.timing._check_kept" in str(raised), raised
