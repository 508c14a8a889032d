"""The profiler's roofline: it takes the reference's FLOP and byte counts from the run's analysis
(counted at the same primary shape) instead of counting again in every profiler child."""

from __future__ import annotations

from kernelbrain.store import EventStore

from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.core.state import RunState
from kernelbrain.runtime.roles import ProfilerRole
from tests.runs import run_interpreted

SCRIPT = """
import json, sys
from pathlib import Path
from kernelbrain.child import analysis, profile

problem = Path("tests/problems/softmax_small.py").read_text()
cand = Path("tests/candidates/good_softmax.py").read_text()
given = profile.roofline(problem, cand, "cpu", repeats=1, flops=123.0, nbytes=4096.0)
counter_loaded = "torch.utils.flop_counter" in sys.modules
analysis = analysis.analyse(problem, "cpu")
counted = profile.roofline(problem, cand, "cpu", repeats=1)
print(json.dumps({"given": given, "counted": counted, "analysis": analysis, "loaded": counter_loaded}))
"""


def test_roofline_uses_the_counts_it_is_given_and_counts_what_the_analysis_counts():
    out = run_interpreted(SCRIPT)
    assert not out["loaded"], "given the counts, the roofline must not load torch's FLOP counter"
    given, counted, analysis = out["given"], out["counted"], out["analysis"]
    assert (given["flops"], given["bytes"]) == (123.0, 4096.0)
    assert given["dram_frac"] == 4096.0 / given["time_s"] / given["bandwidth_Bps"]
    # counted afresh, the roofline's shape and counts are the analysis's: passing them on changes nothing
    assert (counted["flops"], counted["bytes"]) == (analysis["flops"], analysis["bytes"]) != (0, 0)


def test_the_profiler_passes_the_recorded_analysis_counts(tmp_path):
    with EventStore(tmp_path / "kb.db", create=True) as store:
        role = ProfilerRole(store)
        state = RunState("r")
        assert role.counts(state) is None  # no analysis recorded: the child counts for itself
        common = {"ops": [], "families": ["row_softmax"], "shapes": ["a"], "traced_on": "meta"}
        state.analysis = ProblemAnalysed(flops=1e6, bytes=2e6, **common)
        assert role.counts(state) == (1e6, 2e6)
        state.analysis = ProblemAnalysed(flops=0, bytes=0, error="no Model", **common)
        assert role.counts(state) is None
