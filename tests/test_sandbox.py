"""kernelbrain.runtime.sandbox.Sandbox through real child processes: work, hangs, crashes, a clean env.

One module-scoped Sandbox is shared, as a worker shares its own: a fault must leave it able to serve
the next request on a fresh child. The worker's environment holds fake secrets for the whole module,
so every child started here is started by a parent that has them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Literal

import pytest

from kernelbrain.core.protocol import GateReply, GateRequest, Request
from kernelbrain.runtime.child_process import child_limits
from kernelbrain.runtime.limits import FILE_CAP
from kernelbrain.runtime.sandbox import Sandbox, SandboxError, SandboxFault

HERE = Path(__file__).resolve().parent
PROBLEM = (HERE / "problems" / "softmax_small.py").read_text()
SECRETS = {"OPENAI_API_KEY": "sk-kb-test-secret", "AWS_SECRET_ACCESS_KEY": "kb-test-aws-secret"}


def candidate(name: str) -> str:
    return (HERE / "candidates" / f"{name}.py").read_text()


def gate(box: Sandbox, name: str, timeout_s: float = 120.0) -> dict:
    args = {"problem_source": PROBLEM, "cand_source": candidate(name), "device": "cpu", "seeds": 3}
    reply, busy = box.call(GateRequest(**args), timeout_s=timeout_s, task=f"test/{name}")
    result = reply.model_dump()
    assert busy >= 0.0
    return result


def assert_passes(box: Sandbox, name: str = "good_softmax") -> dict:
    result = gate(box, name)
    assert result["passed"] is True, result
    assert result["max_abs_err"] < 1e-5
    return result


def alive(pid: int) -> bool:
    """True while pid is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def exited(pid: int) -> bool:
    """True once our child pid has exited whole (every thread gone) and can be reaped; reaps nothing.

    A child killed from one of its threads shows as a zombie ("Z") while its other threads are still
    exiting; until they are gone the child cannot be waited for, so it is not dead to its parent yet.
    """
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # already reaped


@pytest.fixture(scope="module")
def box():
    with pytest.MonkeyPatch.context() as mp:
        for k, v in SECRETS.items():
            mp.setenv(k, v)
        sb = Sandbox("cpu", fresh_untrusted=False)  # one warm child, as kb's own renders share one
        try:
            yield sb
        finally:
            sb.close()


@pytest.fixture
def warm(box: Sandbox) -> int:
    """The shared sandbox with a live child that has imported torch; returns the child's pid."""
    if box.proc is None:
        assert_passes(box)
    assert box.proc is not None and box.proc.poll() is None
    return box.proc.pid


def test_a_request_runs_in_a_warm_child_of_its_own(box: Sandbox) -> None:
    result = assert_passes(box)
    assert result["seeds"] == 3 and result["tolerance"] == pytest.approx(1e-4)
    assert box.proc is not None
    pid = box.proc.pid
    assert pid != os.getpid() and alive(pid)
    assert os.getsid(pid) == pid, "the child leads its own session"
    assert box.tmp is not None and box.tmp.is_dir()
    assert Path(os.readlink(f"/proc/{pid}/cwd")) == box.tmp.resolve(), "the child runs in its own temp dir"
    executions = box.executions
    assert_passes(box)
    assert box.proc.pid == pid, "a warm child is reused"
    assert box.executions == executions + 1


def test_a_hang_is_a_timeout_and_the_next_request_gets_a_fresh_child(box: Sandbox, warm: int) -> None:
    timeout_s = 5.0
    t0 = time.monotonic()
    with pytest.raises(SandboxFault) as fault:
        gate(box, "hang", timeout_s=timeout_s)
    elapsed = time.monotonic() - t0
    assert fault.value.category == "timeout"
    assert f"{timeout_s:g} s" in fault.value.detail
    assert timeout_s - 0.1 <= elapsed < timeout_s + 4.0
    assert not alive(warm), "the hung child was killed"
    assert box.proc is None
    assert_passes(box)
    assert box.proc is not None and box.proc.pid != warm


def test_a_segfault_is_a_crash_naming_sigsegv(box: Sandbox, warm: int) -> None:
    with pytest.raises(SandboxFault) as fault:
        gate(box, "segfault")
    assert fault.value.category == "crash"
    assert "SIGSEGV" in fault.value.detail
    assert not alive(warm)
    assert_passes(box)
    assert box.proc is not None and box.proc.pid != warm


def test_os_exit_is_a_crash_naming_the_status(box: Sandbox, warm: int) -> None:
    with pytest.raises(SandboxFault) as fault:
        gate(box, "exit3")
    assert fault.value.category == "crash"
    assert "status 3" in fault.value.detail
    assert not alive(warm)
    assert_passes(box)
    assert box.proc is not None and box.proc.pid != warm


def test_the_child_environment_is_scrubbed(box: Sandbox, warm: int) -> None:
    for k, v in SECRETS.items():
        assert os.environ[k] == v  # the worker has them...
    result = gate(box, "env_probe")  # ...the candidate raises if it sees one of them
    assert result["passed"] is True, result
    assert box.tmp is not None
    seen = json.loads((box.tmp / "kb_env_probe.json").read_text())
    assert not set(SECRETS) & set(seen["env"])
    assert {"PATH", "TRITON_INTERPRET"} <= set(seen["env"])  # the probe did list the env
    tmp = str(box.tmp.resolve())
    assert str(Path(seen["cwd"]).resolve()) == tmp
    assert str(Path(seen["home"]).resolve()) == tmp
    assert str(Path(seen["tmp"]).resolve()) == tmp


def test_a_candidate_printing_to_stdout_does_not_corrupt_the_protocol(box: Sandbox, warm: int) -> None:
    assert_passes(box, "noisy_stdout")
    assert_passes(box)
    assert box.proc is not None and box.proc.pid == warm, "no fault, no restart"
    assert box.tmp is not None
    log = (box.tmp / "stderr.log").read_text(errors="replace")
    assert "import: hello from the candidate" in log and "forward: hello from the candidate" in log


def test_sigint_to_the_child_group_does_not_kill_a_request(box: Sandbox, warm: int) -> None:
    sig_ign = int(
        next(
            line
            for line in Path(f"/proc/{warm}/status").read_text().splitlines()
            if line.startswith("SigIgn:")
        ).split()[1],
        16,
    )
    assert sig_ign & (1 << (signal.SIGINT - 1)), "the child ignores SIGINT"
    sent: list[float] = []

    def interrupt() -> None:
        os.killpg(warm, signal.SIGINT)  # what a Ctrl-C in a terminal would do to the child's group
        sent.append(time.monotonic())

    timers = [threading.Timer(delay, interrupt) for delay in (0.3, 0.8)]
    t0 = time.monotonic()
    for t in timers:
        t.start()
    try:
        result = gate(box, "slow")  # 3 seeds x 0.4 s of sleep in forward
    finally:
        for t in timers:
            t.cancel()
            t.join()
    done = time.monotonic()
    assert result["passed"] is True, result
    assert len(sent) == 2 and all(t0 < s < done for s in sent), "both signals landed mid-request"
    assert box.proc is not None and box.proc.pid == warm and alive(warm)
    assert_passes(box)


class Bogus(Request[GateReply]):
    """A request the child does not serve: it cannot parse it, which is kb's failure, not a candidate's."""

    op: Literal["no_such_op"] = "no_such_op"


def test_kbs_own_failure_is_a_sandbox_error_and_keeps_the_child(box: Sandbox, warm: int) -> None:
    with pytest.raises(SandboxError, match="no_such_op"):
        box.call(Bogus(), timeout_s=60)
    assert box.proc is not None and box.proc.pid == warm
    assert_passes(box)


def test_a_child_that_died_between_requests_is_not_blamed_on_the_next_candidate(
    box: Sandbox, warm: int
) -> None:
    try:
        assert_passes(box, "delayed_exit")  # passes, and leaves a thread that calls os._exit(7) 1.5 s later
        deadline = time.monotonic() + 10
        while not exited(warm) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(warm) and exited(warm)
        assert_passes(box)  # an innocent candidate
    finally:
        box.close()


def test_a_malformed_reply_is_a_fault_and_the_next_request_gets_a_fresh_child(
    box: Sandbox, warm: int
) -> None:
    try:
        with pytest.raises(SandboxFault) as fault:
            gate(box, "protocol_garbage")
        assert fault.value.category == "crash"
        assert not alive(warm)
        assert_passes(box)
    finally:
        box.close()


def test_a_gpu_roles_cuda_child_makes_its_context_before_its_first_task(tmp_path) -> None:
    """The gatekeeper's, benchmarker's and profiler's CUDA children make the context while they wait; the
    generator's (a run's first task, traced on the meta device) and every CPU child do not."""
    from kernelbrain.runtime.roles import ROLE_CLASSES

    for device, role, expected in [
        ("cuda", "gatekeeper", "1"),
        ("cuda", "benchmarker", "1"),
        ("cuda", "profiler", "1"),
        ("cuda", "generator", None),
        ("cpu", "gatekeeper", None),
    ]:
        sb = Sandbox(device, warm_cuda=ROLE_CLASSES[role].warms_cuda)
        assert sb._env(tmp_path, "none").get("KB_WARM_CUDA") == expected, (device, role)
        # a spare, started while another request may time on the GPU, warms at its first request
        spare = sb._env(tmp_path, "none", spare=True).get("KB_WARM_CUDA")
        assert spare == (None if expected is None else "first"), (device, role)


def test_a_bench_is_charged_its_timed_calls_and_the_references_alone(box: Sandbox) -> None:
    """The busy seconds a bench returns (what the benchmarker charges) hold at least every timed call,
    the candidate's and the reference's beside it, and the judge's time alone; a memo hit there for
    the reference's clean time must not replace the bench's own."""
    from kernelbrain.core.protocol import BenchRequest

    args = {"problem_source": PROBLEM, "cand_source": candidate("good_softmax"), "device": "cpu"}
    request = BenchRequest(**args, which="smallest", repeats=4, warmup=1)
    for _ in range(2):  # the second: the judge's clean time is kept, its request costs next to nothing
        reply, busy = box.call(request, timeout_s=300)
        timed = sum(s.repeats * s.calls * (s.cand_median_s + s.ref_median_s) for s in reply.shapes)
        assert busy >= timed > 0, (busy, timed)


def test_a_child_writes_a_file_past_4_gib_but_not_past_the_cap(tmp_path) -> None:
    """A problem's 4 GiB input is drawn into one file (100_HingeLoss's was cut short by a 4 GiB cap); a
    write past FILE_CAP fails ("File too large": Python ignores SIGXFSZ). Sparse files: offsets count,
    not the disk."""

    def write_at(offset: int) -> subprocess.CompletedProcess:
        code = f"f = open({str(tmp_path / 'big')!r}, 'wb'); f.seek({offset}); f.write(b'x'); f.close()"
        run = [sys.executable, "-c", code]
        return subprocess.run(run, preexec_fn=child_limits, capture_output=True, text=True)

    assert write_at((4 << 30) + 4096).returncode == 0
    past = write_at(FILE_CAP)
    assert past.returncode != 0 and "File too large" in past.stderr


def test_a_crash_tells_nothing_of_a_file_the_child_linked_its_log_to(tmp_path: Path) -> None:
    """A crash's detail names the last line of the child's log; a candidate that swapped the log for a
    link to a file only the worker may read must not get that file's line back."""
    secret = tmp_path / "secret"
    secret.write_text("kb-worker-only-secret-line\n")
    secret.chmod(0o600)
    leak = (
        "import os\n"
        "_log = os.path.join(os.environ['HOME'], 'stderr.log')\n"
        "os.unlink(_log)\n"
        f"os.symlink({str(secret)!r}, _log)\n"
        "os._exit(3)\n"
    )
    sb = Sandbox("cpu")
    try:
        request = GateRequest(
            problem_source=PROBLEM, cand_source=leak + candidate("good_softmax"), device="cpu", seeds=1
        )
        with pytest.raises(SandboxFault) as fault:
            sb.call(request, timeout_s=120.0)
    finally:
        sb.close()
    assert "status 3" in fault.value.detail, fault.value.detail
    assert "kb-worker-only-secret-line" not in fault.value.detail, fault.value.detail
