"""`kb check` gates (and with --bench times) one hand-written candidate outside any run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.kbcli import SOFTMAX, kb
from tests.test_shapes import LAST_DIM_NORM

CANDIDATES = Path(__file__).parent / "candidates"


def test_a_good_candidate_passes_and_is_timed(tmp_path):
    r = kb("check", str(SOFTMAX), str(CANDIDATES / "good_softmax.py"), "--device", "cpu", "--bench", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["passed"] is True and out["category"] is None and out["max_abs_err"] < 1e-5
    assert [rung["rung"] for rung in out["rungs"]] == [0, 1, 2]
    first = out["rungs"][0]["shapes"][0]
    assert (
        first["shape"] == "batch_size=8,dim=200" and first["cand_median_s"] > 0 and first["ref_median_s"] > 0
    )
    assert out["rungs"][0]["timer"] == "interpreter-wallclock"
    assert not list(tmp_path.iterdir()), "kb check writes no database"


def test_a_bad_candidate_fails_with_its_category():
    r = kb("check", str(SOFTMAX), str(CANDIDATES / "decoy_kernel.py"), "--device", "cpu")
    assert r.returncode == 1
    assert r.stdout.startswith("FAILED [policy]: ") and "softmax" in r.stdout
    j = json.loads(
        kb("check", str(SOFTMAX), str(CANDIDATES / "exp_only.py"), "--device", "cpu", "--json").stdout
    )
    assert j["passed"] is False and j["category"] == "mismatch" and j["max_abs_err"] > 1


def test_a_missing_candidate_file_is_one_line(tmp_path):
    r = kb("check", str(SOFTMAX), str(tmp_path / "nope.py"), "--device", "cpu")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"Error: candidate file {tmp_path / 'nope.py'} does not exist; pass a .py file defining ModelNew"
    ]


def test_a_problem_that_raises_is_the_problems_fault_not_the_candidates(tmp_path):
    problem = tmp_path / "raises.py"
    raising = "def get_inputs():\n    raise RuntimeError('no data')\n"
    problem.write_text(SOFTMAX.read_text().replace("def get_inputs():", raising, 1))
    r = kb("check", str(problem), str(CANDIDATES / "good_softmax.py"), "--device", "cpu")
    assert r.returncode == 4, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"Error: problem file {problem} cannot be evaluated") and "no data" in line, line


def test_the_gate_checks_the_shape_a_run_would_fit(tmp_path):
    """Sizes are fitted as a run's analysis fits them, on the reference: a LayerNorm whose width is the
    declared last dimension keeps it, and the candidate (not the problem) is judged."""
    problem = tmp_path / "last_dim_norm.py"
    problem.write_text(LAST_DIM_NORM)
    unparsable = tmp_path / "unparsable.py"  # within the subset as far as it reads: the child judges it
    unparsable.write_text((CANDIDATES / "good_softmax.py").read_text() + "\ndef broken(:\n")
    r = kb("check", str(problem), str(unparsable), "--device", "cpu", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["passed"] is False and out["category"] == "compile", out
