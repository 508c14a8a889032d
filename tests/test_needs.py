"""A test that needs what the machine lacks (tests/needs.py) is skipped with one line naming the piece and
the tests skipped for it, and fails instead under CI; ./test.sh learns which packages to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALONE = ["-o", "addopts=-ra", "-n", "0", "-p", "no:cacheprovider"]  # no workers, skips summarised
TEST = "tests/test_report.py::test_chromium_draws_every_plot"  # marked needs("chromium")


def bare(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment with an empty PATH (no chromium, bwrap or initdb) and an empty KB_PG_BIN."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "pg").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KB_BWRAP")) and k != "CI"}
    env.update(PATH=str(tmp_path / "bin"), KB_PG_BIN=str(tmp_path / "pg"), PYTHONPATH=str(ROOT), **extra)
    return env


def pytest_of(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One test run alone in a child pytest (no workers), its skips summarised as in the suite."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", *ALONE, TEST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_missing_pieces_are_named_with_their_packages(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tests.needs"], cwd=ROOT, env=bare(tmp_path), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["postgresql", "chromium", "bubblewrap"]


def test_a_missing_piece_skips_its_tests_with_one_line(tmp_path: Path) -> None:
    r = pytest_of(tmp_path, bare(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "missing headless Chromium: 1 test skipped (test_report.py 1)" in lines, r.stdout
    skipped = [line for line in lines if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and skipped[0].startswith("SKIPPED [1] tests/conftest.py:"), r.stdout
    fix = "apt-get install chromium (./test.sh does, as root)"
    assert skipped[0].endswith(f"headless Chromium is missing (no chromium on PATH): {fix}")


def test_under_ci_a_missing_piece_fails_its_tests(tmp_path: Path) -> None:
    r = pytest_of(tmp_path, bare(tmp_path, CI="true"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CI is set and headless Chromium is missing (no chromium on PATH)" in r.stdout
    assert "1 error" in r.stdout.splitlines()[-1] and "skipped" not in r.stdout.splitlines()[-1]
