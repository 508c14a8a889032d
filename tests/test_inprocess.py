"""`kb run --inprocess`: the five roles take turns in one process and share two sandboxed children, one
for every role's candidates and the judge (which also traces the analysis), rather than a pair a role."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.invariants import check_run, read_exec_log
from tests.kbcli import SOFTMAX, kb_env


def _children_of(root: int) -> set[tuple[int, str]]:
    """The `kernelbrain.child` processes descending from `root` now, as (pid, start time)."""
    parents: dict[int, int] = {}
    found: set[tuple[int, str]] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(stat[1])
        if cmdline[1:3] == [b"-m", b"kernelbrain.child"]:  # the child itself, not its wrapper (bwrap)
            found.add((pid, stat[19]))
    mine = set()
    for pid, start in found:
        p = pid
        while p > 1:
            p = parents.get(p, 0)
            if p == root:
                mine.add((pid, start))
                break
    return mine


def test_an_inprocess_run_starts_one_candidate_child_and_one_judge(tmp_path):
    db, log = tmp_path / "kb.db", tmp_path / "exec.log"
    args = ["--db", str(db), "--max-candidates", "2", "--device", "cpu", "--ladder", "smallest:1:0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelbrain", "run", str(SOFTMAX), *args, "--inprocess", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kb_env(KB_EXEC_LOG=str(log)),
    )
    seen: set[tuple[int, str]] = set()
    while proc.poll() is None:
        seen |= _children_of(proc.pid)
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    check_run(db, out.split()[1], log)
    ops = [op for _, _, op in read_exec_log(log)]
    # the analysis, two gates (draws, trial, judge), two benches (each with the reference alone) ran
    assert ops.count("analyse") == 1 and ops.count("trial") == 2 and ops.count("bench") == 2, ops
    assert len(seen) == 2, f"{len(seen)} sandboxed children started: {sorted(seen)}"
