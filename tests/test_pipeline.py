"""The whole pipeline on CPU through the real CLI: kb run (separate worker processes) and the
commands that read a run back: ls, status, events, replay, audit, export."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kernelbrain.store import EventStore

from kernelbrain.core.policy import POLICY_VERSION
from kernelbrain.core.state import RunState
from tests.invariants import check_run, read_exec_log
from tests.kbcli import SOFTMAX, kb, kb_env


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    db, log = tmp / "kb.db", tmp / "exec.log"
    r = kb(
        "run",
        str(SOFTMAX),
        "--db",
        str(db),
        "--max-candidates",
        "6",
        "--device",
        "cpu",
        env=kb_env(KB_EXEC_LOG=str(log)),
    )
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.split()[1]
    return db, run_id, r.stdout, log


def _all_proposed(n: int, reason: str) -> None:
    """The run proposed its 6 candidates, or ended because the mutations ran out: which finalist is
    profiled (and so mutated) rests on CPU timings, and a mutation that renders an existing candidate
    is a duplicate, not a new one. Round 0 proposes 4, and at least one mutation came."""
    if reason.startswith("candidate budget reached"):
        assert n == 6, (n, reason)
    else:
        assert reason == "search exhausted: no mutation left to try" and 4 < n < 6, (n, reason)


def test_run_prints_id_progress_and_winner(finished_run):
    _, run_id, out, _ = finished_run
    assert out.startswith(f"run {run_id}\n")
    assert "gate passed" in out and "promoted" in out and "profiled" in out
    # the accuracy contract measured in the analysis (a softmax has no contraction: IEEE, nothing measured)
    assert "; accuracy: IEEE fp32 reference (cpu): candidates within their dtype's tolerance" in out
    assert f"run {run_id} finished: " in out and "winner " in out


def test_run_log_holds_its_invariants(finished_run):
    db, run_id, _, log = finished_run
    state = check_run(db, run_id, log)
    _all_proposed(len(state.candidates), state.finished.reason)
    assert state.finished.winner in state.candidates
    strategies = {c.proposal.strategy for c in state.candidates.values()}
    assert len(strategies) >= 2
    mutated = [c for c in state.candidates.values() if c.proposal.parent]
    assert mutated and all(c.proposal.diagnosis for c in mutated)


def test_every_role_ran_in_one_worker_process_apart_from_kb_run(finished_run):
    """On a CPU device, one worker process steps every role (the LLM generator's own: test_llm_run)."""
    db, run_id, _, _ = finished_run
    r = kb("events", run_id, "--db", str(db), "--json")
    events = [json.loads(line) for line in r.stdout.splitlines()]
    pid = {e["actor"].split("@")[0]: e["actor"].split(":")[1] for e in events if "@" in e["actor"]}
    assert set(pid) == {"generator", "gatekeeper", "benchmarker", "profiler", "scheduler"}
    assert len(set(pid.values())) == 1


def test_the_run_records_its_sandboxs_limits(finished_run):
    db, run_id, _, _ = finished_run
    with EventStore(db, create=False) as store:
        started = next(e.payload for e in store.iter_events(run_id=run_id) if e.type == "RunStarted")
    limits = started["hardware"]["limits"]
    assert limits["memory_bytes"] > 0 and limits["file_bytes"] > 0 and limits["memory_by"] == "RLIMIT_DATA"
    assert {"uid", "processes", "folder_bytes", "cgroup"} <= set(limits)


def test_status_ls_and_events(finished_run):
    db, run_id, _, _ = finished_run
    status = json.loads(kb("status", run_id, "--db", str(db), "--json").stdout)
    assert status["state"] == "finished" and status["winner"]
    with EventStore(db, create=False) as store:
        reason = store.fold(RunState(run_id), run_id=run_id).finished.reason
    _all_proposed(status["candidates"]["proposed"], reason)
    assert status["budget"]["gpu_s"] > 0
    text = kb("status", run_id, "--db", str(db)).stdout
    assert "finalists" in text and status["winner"] in kb("ls", "--db", str(db)).stdout
    listed = json.loads(kb("ls", "--db", str(db), "--json").stdout)
    assert [r["run_id"] for r in listed] == [run_id]
    lines = kb("events", run_id, "--db", str(db)).stdout.splitlines()
    assert "RunStarted" in lines[0] and "RunFinished" in lines[-1]
    every = kb("events", run_id, "--db", str(db), "--all").stdout
    assert "TaskClaimed" in every and "BudgetCharged" in every


def test_the_analysis_is_charged_wall_time_but_no_gpu_time(finished_run):
    """It traces the reference on the meta device (shapes only): the GPU is free while it runs."""
    db, run_id, _, _ = finished_run
    with EventStore(db, create=False) as store:
        charges = [e.payload for e in store.iter_events(run_id=run_id) if e.type == "BudgetCharged"]
    gen = next(c for c in charges if c["action"].endswith("/gen/round0"))
    assert gen["gpu_s"] == 0.0 and gen["wall_s"] > 0.0
    assert all(c["gpu_s"] > 0 for c in charges if c["role"] == "gatekeeper")


def test_replay_agrees(finished_run):
    db, run_id, _, _ = finished_run
    r = kb("replay", run_id, "--db", str(db))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"agree with policy v{POLICY_VERSION}" in r.stdout  # new runs decide under the current policy


def test_audit_explains_the_winner(finished_run):
    db, run_id, _, _ = finished_run
    status = json.loads(kb("status", run_id, "--db", str(db), "--json").stdout)
    text = kb("audit", run_id, "--db", str(db)).stdout
    assert f"Winner: {status['winner']}" in text
    assert "  accuracy contract: IEEE fp32 reference (cpu)" in text
    for section in (
        "Lineage (root first):",
        "Gate:",
        "Ladder:",
        "Runners-up:",
        "rung 0",
        "promoted to rung 1",
        "peers:",
        "threshold",
    ):
        assert section in text, section


def test_audit_of_a_mutation_names_its_diagnosis(finished_run):
    db, run_id, _, _ = finished_run
    from kernelbrain.store import EventStore

    from kernelbrain.core.state import RunState

    with EventStore(db, create=False) as store:
        state = store.fold(RunState(run_id), run_id=run_id)
    child = next(c for c in state.candidates.values() if c.proposal.parent)
    text = kb("audit", run_id, "--db", str(db), "--candidate", child.id).stdout
    assert child.proposal.parent in text and "parent's diagnosis" in text


def test_export_is_a_standalone_module(finished_run, tmp_path):
    db, run_id, _, _ = finished_run
    out = tmp_path / "kernel.py"
    assert kb("export", run_id, "--db", str(db), "-o", str(out)).returncode == 0
    assert "\n# Accuracy: IEEE fp32 reference (cpu): " in out.read_text()  # the contract it was held to
    # import it in a clean interpreter without kernelbrain on the path, and check it against the reference
    check = f"""
import sys, importlib.util, torch
sys.path = [p for p in sys.path if 'kernelbrain' not in p and p not in ('', '.')]
spec = importlib.util.spec_from_file_location('k', {str(out)!r}); k = importlib.util.module_from_spec(spec)
spec.loader.exec_module(k)
assert 'kernelbrain' not in sys.modules
x = torch.randn(5, 300)
torch.testing.assert_close(k.ModelNew()(x), torch.softmax(x, dim=1), atol=1e-5, rtol=1e-5)
print('ok')
"""
    env = {k: v for k, v in kb_env(TRITON_INTERPRET="1").items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.stdout.strip() == "ok", r.stderr


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
        except (OSError, IndexError):
            continue
        parents[int(entry.name)] = int(stat[1])
        if cmdline[1:3] == [b"-m", b"kernelbrain.child"]:  # the child itself, not its wrapper (bwrap)
            found.add((int(entry.name), stat[19]))
    mine = set()
    for pid, start in found:
        up = parents.get(pid, 0)
        while up > 1 and up != root:
            up = parents.get(up, 0)
        if up == root:
            mine.add((pid, start))
    return mine


def test_inprocess_mode_reaches_the_same_kind_of_result(tmp_path):
    """The roles take turns in kb's own process and share two sandboxed children: one for every role's
    candidates, and the judge (which also traces the analysis), rather than a pair a role."""
    db, log = tmp_path / "kb.db", tmp_path / "exec.log"
    args = ["--db", str(db), "--max-candidates", "2", "--inprocess", "--quiet"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelbrain", "run", str(SOFTMAX), *args],
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
    assert ops.count("analyse") == 1 and ops.count("trial") == 2, ops
    assert len(seen) == 2, f"{len(seen)} sandboxed children started: {sorted(seen)}"


def test_events_follow_streams_until_the_run_finishes(tmp_path):
    from tests.kbcli import kb_start

    db = tmp_path / "kb.db"
    proc, run_id = kb_start(
        ["run", str(SOFTMAX), "--db", str(db), "--max-candidates", "2", "--quiet", "--inprocess"]
    )
    follow = kb("events", run_id, "--db", str(db), "--follow", "--json", timeout=300)
    proc.wait(timeout=300)
    assert follow.returncode == 0, follow.stderr
    types = [json.loads(line)["type"] for line in follow.stdout.splitlines()]
    assert types[0] == "RunStarted" and types[-1] == "RunFinished"
    seqs = [json.loads(line)["seq"] for line in follow.stdout.splitlines()]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))


def test_standalone_workers_serve_a_run_started_without_its_own(tmp_path):
    """`kb worker ROLE` processes, not started by kb run and serving every run in the file, finish it;
    SIGTERM then stops them cleanly."""
    import signal

    from tests.kbcli import kb_start

    db = tmp_path / "kb.db"
    proc, run_id = kb_start(
        ["run", str(SOFTMAX), "--db", str(db), "--max-candidates", "3", "--external-workers", "--quiet"]
    )
    roles = ["generator", "gatekeeper", "benchmarker", "profiler", "scheduler"]
    workers = [
        subprocess.Popen([sys.executable, "-m", "kernelbrain", "worker", role, "--db", str(db)], env=kb_env())
        for role in roles
    ]
    try:
        proc.wait(timeout=300)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
        check_run(db, run_id)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=60) for w in workers]
    assert codes == [0] * len(roles)


def test_the_ladder_is_configuration(tmp_path):
    db = tmp_path / "kb.db"
    r = kb(
        "run",
        str(SOFTMAX),
        "--db",
        str(db),
        "--max-candidates",
        "1",
        "--inprocess",
        "--quiet",
        "--ladder",
        "smallest:2,all:4:1",
    )
    assert r.returncode == 0, r.stderr
    status = json.loads(kb("status", r.stdout.split()[1], "--db", str(db), "--json").stdout)
    assert status["measured_at_rung"] == [1, 1]
    bad = kb("run", str(SOFTMAX), "--db", str(db), "--ladder", "biggest:3")
    assert bad.returncode == 1 and bad.stderr.startswith("Error: bad rung 'biggest:3' in --ladder")


def test_a_problem_outside_every_family_says_what_to_do(tmp_path):
    db = tmp_path / "kb.db"
    problem = SOFTMAX.parent / "sort_small.py"
    r = kb("run", str(problem), "--db", str(db), "--inprocess", "--quiet", "--device", "cpu")
    assert r.returncode == 3, r.stderr  # the run ends with no kernel
    assert "no offline template matches sort; use --generator llm" in r.stdout
