"""tools/compile_warm: the sweep's baselines compiled in a child beside the runs, sharing only Triton's
kernel cache with the timing that follows; a contender that fails there, or a child that dies, is
reported and costs the timing nothing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.kbcli import SOFTMAX
from tools import compile_warm

WINNER = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)
"""


def _scratch_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("kb-warm-*")}


def test_each_contender_is_called_once_a_failing_one_named_and_no_inductor_cache_left(
    tmp_path, monkeypatch
) -> None:
    """The winner alone (torch.compile on a CPU is its C++ compiler's seconds; on a GPU the same loop
    compiles both modes): a winner that works, then one that fails."""
    monkeypatch.setenv("KB_LOCKS", str(tmp_path / "locks"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # cache_dir() sets it
    before = _scratch_folders()
    report = compile_warm.warm(SOFTMAX.read_text(), WINNER, "cpu", compile_modes="")
    assert "error" not in report, report
    first = report["first_calls_s"]
    assert set(first) == {"kb"} and isinstance(first["kb"], float), first
    assert 0 < first["kb"] <= report["wall_s"], report
    broken = WINNER.replace("return torch.softmax(x, dim=1)", "raise RuntimeError('no kernel for this')")
    report = compile_warm.warm(SOFTMAX.read_text(), broken, "cpu", compile_modes="")
    assert report["first_calls_s"] == {"kb": "RuntimeError: no kernel for this"}, report
    # the Triton cache is named for the child and the timing alike; Inductor's private folder is gone
    assert os.environ["TRITON_CACHE_DIR"] == compile_warm.shared_triton_cache()
    assert _scratch_folders() == before


def test_the_modes_timed_on_a_device_are_the_ones_compiled() -> None:
    assert compile_warm.modes("cpu") == {"compile": "default"}
    assert compile_warm.modes("cuda") == compile_warm.COMPILE_MODES


def test_a_child_that_dies_is_one_error_not_a_failed_timing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KB_LOCKS", str(tmp_path / "locks"))
    bad = tmp_path / "broken_problem.py"
    bad.write_text("import torch\nraise SystemExit('this problem file exits on import')\n")
    report = compile_warm.warm(bad.read_text(), WINNER, "cpu")
    assert report["error"].startswith("exit 1: this problem file exits on import"), report
    assert "first_calls_s" not in report
