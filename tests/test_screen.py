"""The benchmark's screen: a candidate's first outputs at each benchmarked shape against the reference's,
failing only far outside the gate's tolerance (faults that show only at scale), and a failed check comes
back from the child as the candidate's fault with its category, the child kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelbrain.child import screen as screening
from kernelbrain.child.loading import CandidateFault, Problem
from kernelbrain.child.screen import SCREEN
from kernelbrain.core.protocol import BenchRequest
from kernelbrain.runtime.sandbox import SandboxFault
from tests.kbcli import SOFTMAX

CANDIDATES = Path(__file__).parent / "candidates"
PROBLEM = Problem(SOFTMAX.read_text())
SHAPE = {"batch_size": 8, "dim": 200}


def screen(got, expected) -> None:
    screening.screen(PROBLEM, SHAPE, [got], [expected])


def test_rounding_a_kernel_may_differ_by_passes():
    x = torch.randn(64, 3000) * 5
    ref = torch.softmax(x, -1)
    screen(ref.clone(), ref)
    screen(torch.softmax(x.double(), -1).float(), ref)  # another summation order, in float64
    screen(torch.softmax(x.bfloat16(), -1), torch.softmax(x.float(), -1).bfloat16())  # bf16 rounding
    screen(torch.tensor(3.0), torch.tensor(3.0 + 1e-6))  # 0-dim outputs
    screen(torch.empty(0, 5), torch.empty(0, 5))  # and empty ones
    inf = torch.tensor([1.0, float("inf")])
    screen(torch.tensor([1.0, 5.0]), inf)  # where the reference is not finite the gate judged


def test_a_row_normalised_with_half_its_statistics_fails():
    x = torch.rand(64, 393216)  # the softmax seed's rows: every value near 2.5e-6, far below 1e-3
    ref = torch.softmax(x, -1)
    got = ref.clone()
    got[17] *= 2  # a row whose sum of exponentials missed half its chunks
    with pytest.raises(CandidateFault, match=r"at 0 of \d+ elements and in 1 of 64 lines") as e:
        screen(got, ref)
    assert e.value.category == "mismatch" and "benchmark shape batch_size=8,dim=200" in e.value.detail
    got = ref.clone()
    got[3, 5] = float("nan")
    with pytest.raises(CandidateFault, match=r"at 1 of .* in 1 of 64 lines"):
        screen(got, ref)


def test_the_screen_sits_at_screen_times_the_tolerance():
    tol = SCREEN * 1e-4  # fp32
    ref = torch.softmax(torch.randn(64, 3000), -1)
    screen(ref * (1 + 0.9 * tol), ref)  # lines off by 0.9 tol: inside
    with pytest.raises(CandidateFault, match=r"at 0 of .* in 64 of 64 lines"):
        screen(ref * (1 + 2.1 * tol), ref)
    big = torch.randn(64, 3000) + 3
    off = big.clone()
    off[9, 9] += 2.1 * tol * (1 + abs(float(big[9, 9])))  # one element: its line's RMS hardly moves
    with pytest.raises(CandidateFault, match=r"at 1 of .* in 0 of 64 lines"):
        screen(off, big)


def test_the_screen_reads_every_slice_of_a_large_output():
    ref = torch.zeros(5000, 4000)  # two slices of 2**24 elements' worth of rows
    got = ref.clone()
    got[4999, 3999] = 1.0
    with pytest.raises(CandidateFault, match="at 1 of 20000000 elements and in 1 of 5000 lines"):
        screen(got, ref)
    with pytest.raises(CandidateFault, match="shape"):
        screen(got[:10], ref)


def bench(box, name: str) -> dict:
    args = {
        "problem_source": SOFTMAX.read_text(),
        "cand_source": (CANDIDATES / name).read_text(),
        "device": "cpu",
        "which": "smallest",
        "repeats": 1,
        "warmup": 0,
    }
    return box.call(BenchRequest(**args), timeout_s=120)[0].model_dump()


@pytest.mark.parametrize("name", ["exp_only.py", "nan_output.py"])
def test_a_wrong_candidate_is_refused_at_the_benchmark_and_the_child_lives_on(box, name):
    bench(box, "good_softmax.py")
    pid = box.proc.pid
    with pytest.raises(SandboxFault) as e:
        bench(box, name)
    assert e.value.category == "mismatch" and "benchmark shape batch_size=8,dim=200" in e.value.detail
    assert box.proc.pid == pid and box.proc.poll() is None  # a verdict, not a crash: same child
    assert bench(box, "good_softmax.py")["shapes"][0]["speedup"] > 0
