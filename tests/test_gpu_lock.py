"""The GPU lock between processes of one host: a request that times waits for every other request on the
GPU to end, and they wait for it; requests that do not time share the GPU. Real processes, a real lock."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernelbrain.core.protocol import BenchRequest, DuelRequest, GateRequest, ReferenceTimeRequest
from kernelbrain.runtime import gpu_lock
from kernelbrain.runtime.sandbox import TIMED

HOLDER = """
import os, sys, time
from kernelbrain.runtime import gpu_lock
os.environ["KB_LOCKS"] = sys.argv[1]
with gpu_lock.held("0", alone=sys.argv[2] == "alone") as hold:
    print("held", flush=True)
    if sys.argv[3] == "stdin":
        sys.stdin.readline()
    else:
        time.sleep(float(sys.argv[3]))
print("released", hold.to, flush=True)
"""


def hold(tmp_path: Path, alone: bool, seconds: float | None, device: str = "0") -> subprocess.Popen:
    """Another process holding `device`'s lock for `seconds` (None: until a line on its stdin), once it
    says so."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER.replace('"0"', f'"{device}"'),
            str(tmp_path),
            "alone" if alone else "shared",
            "stdin" if seconds is None else str(seconds),
        ],
        stdin=subprocess.PIPE if seconds is None else None,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def waited(alone: bool) -> float:
    start = time.monotonic()
    with gpu_lock.held("0", alone=alone) as got:
        took = time.monotonic() - start
    assert took - 0.2 <= got.lock_s <= took  # the hold records what it waited (BudgetCharged's lock_wait_s)
    return took


def test_going_alone_records_the_wait_for_the_shared_holders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    with gpu_lock.held("0", alone=False) as got:
        assert got.lock_s < 0.5
        other = hold(tmp_path, False, 1.5)  # a gate that came while this bench prepared
        try:
            got.go_alone()
        finally:
            other.kill()
        assert got.alone and 1.0 < got.lock_s < 10.0
    # the wait to go alone is the lock's wait, not its hold (session 32's sweep counted it as both)
    assert got.held_s < 0.5, got


@pytest.mark.parametrize(
    ("other_alone", "alone", "blocks"), [(False, True, True), (True, False, True), (False, False, False)]
)
def test_timing_waits_for_the_gpus_other_work_and_other_work_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other_alone: bool, alone: bool, blocks: bool
) -> None:
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    other = hold(tmp_path, other_alone, 1.5)
    try:
        took = waited(alone)
        assert (took > 1.0) == blocks, took
    finally:
        other.wait(timeout=10)


def test_a_timing_waiting_goes_before_later_shared_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool of gatekeepers holds the lock shared one after another: a timing request waits for those
    holding it when it came, while one that comes after it waits for the timing (flock alone would let
    the later ones in, and the timing could wait for ever). Ordered by the holds' own clocks, not by
    sleeps: a loaded machine changes nothing."""
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    gate = subprocess.Popen(  # holds it shared until told
        [sys.executable, "-c", HOLDER, str(tmp_path), "shared", "stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert gate.stdout is not None and gate.stdin is not None and gate.stdout.readline().strip() == "held"
    timing = subprocess.Popen(  # waits for the gate, then holds it alone for 0.3 s
        [sys.executable, "-c", HOLDER, str(tmp_path), "alone", "0.3"], stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not _held(tmp_path / "gpu-0.turnstile"):  # the timing is waiting, at the turnstile
            assert time.monotonic() < deadline and timing.poll() is None, "the timing never waited"
            time.sleep(0.01)
        later: list[gpu_lock.Hold] = []
        shared = threading.Thread(target=lambda: later.append(_take_shared()))
        shared.start()
        gate.stdin.write("go\n")
        gate.stdin.flush()
        shared.join(timeout=60)
        assert timing.stdout is not None and timing.stdout.readline().strip() == "held"
        released = float(timing.stdout.readline().split()[1])
        (got,) = later
        assert got.since >= released, "a later shared request went before the waiting timing"
        assert got.to >= got.since and not got.alone
    finally:
        gate.wait(timeout=10)
        timing.wait(timeout=10)


def _held(path: Path) -> bool:
    """Whether another process holds the lock file (a non-blocking try fails)."""
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _take_shared() -> gpu_lock.Hold:
    with gpu_lock.held("0", alone=False) as got:
        pass
    return got


def test_another_gpu_is_another_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    other = hold(tmp_path, True, 1.5)
    try:
        start = time.monotonic()
        with gpu_lock.held("1", alone=True):
            assert time.monotonic() - start < 1.0
    finally:
        other.wait(timeout=10)


def test_what_times_holds_the_gpu_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(issubclass(r, TIMED) for r in (BenchRequest, DuelRequest, ReferenceTimeRequest))
    assert not issubclass(GateRequest, TIMED)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert gpu_lock.gpu_name(None) == "3" and gpu_lock.gpu_name(2) == "2"


def test_a_shared_hold_goes_alone_once_the_others_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    other = hold(tmp_path, False, 1.5)
    try:
        start = time.monotonic()
        with gpu_lock.held("0", alone=False) as mine:
            assert time.monotonic() - start < 1.0  # shared beside the other
            mine.go_alone()
            assert time.monotonic() - start > 1.0 and mine.alone
        out = other.communicate(timeout=10)[0].split()
        assert mine.since >= float(out[-1])  # alone from when the other let go, not before
    finally:
        other.kill()


def test_a_rung_prepares_sharing_the_device_and_times_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rung's child builds, loads and warms while another request holds the device (a gate), then
    waits for it; its hold is alone from when that request ended, so the timed span it records leaves
    the preparation out, and its busy seconds leave out the wait."""
    from kernelbrain.runtime.sandbox import Sandbox

    here = Path(__file__).resolve().parent
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    holder = hold(tmp_path, False, None, device="cpu")
    box = Sandbox("cpu", fresh_untrusted=False)
    try:
        request = BenchRequest(
            problem_source=(here / "problems" / "softmax_small.py").read_text(),
            cand_source=(here / "candidates" / "good_softmax.py").read_text(),
            device="cpu",
            which="smallest",
            repeats=2,
            warmup=1,
        )
        started = time.time()
        bench = threading.Thread(target=box.call, args=(request,), kwargs={"timeout_s": 300})
        bench.start()
        deadline = time.monotonic() + 240
        # the child prepared beside the holder and waits to time: a request waiting to go alone holds
        # the turnstile
        while not _held(tmp_path / "gpu-cpu.turnstile"):
            assert bench.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(2.0)
        assert box.last_hold is not None and not box.last_hold.alone
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        released = float(holder.communicate(timeout=30)[0].split()[-1])
        bench.join(timeout=240)
        last = box.last_hold
        assert last.alone and last.since >= released > started and last.to >= last.since
        assert box.bench_phases["bench.wait"] >= 2.0  # the child waited, prepared, for the device
        # the wait is the holder's time, not the rung's: its busy seconds (its GPU charge) leave it out
        phases = box.bench_phases
        steps = sum(v for k, v in phases.items() if k.startswith("bench.") and k != "bench.wait")
        assert phases["bench"] < steps + 1.0 < steps + phases["bench.wait"]
    finally:
        holder.kill()
        box.close()


@pytest.mark.parametrize("own_code", [True, False], ids=["kbs-own", "from-outside"])
def test_a_gate_holds_the_device_for_its_device_work_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_code: bool
) -> None:
    """A gate of kb's own code lets the device go while its candidate loads (and compiles: its child's
    marks), so a timing goes between the gate's device work; the trial of a candidate from outside holds
    the device throughout (its child's marks may not let it go)."""
    from kernelbrain.runtime.sandbox import Sandbox

    here = Path(__file__).resolve().parent
    monkeypatch.setenv("KB_LOCKS", str(tmp_path / "locks"))
    log = tmp_path / "exec.log"
    monkeypatch.setenv("KB_EXEC_LOG", str(log))
    slow = "import time\ntime.sleep(4)\n" + (here / "candidates" / "good_softmax.py").read_text()
    request = GateRequest(
        problem_source=(here / "problems" / "softmax_small.py").read_text(),
        cand_source=slow,
        device="cpu",
        seeds=2,
    )
    box = Sandbox("cpu", fresh_untrusted=False, writable=(str(tmp_path),))
    replies: list = []
    gating = threading.Thread(
        target=lambda: replies.append(box.call(request, timeout_s=300, own_code=own_code)[0])
    )
    try:
        gating.start()
        deadline = time.monotonic() + 240
        while " trial" not in (log.read_text() if log.exists() else ""):  # the candidate loads now
            assert gating.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        start = time.monotonic()
        with gpu_lock.held("cpu", alone=True):
            waited, trial_running = time.monotonic() - start, gating.is_alive()
        gating.join(timeout=240)
        assert replies and replies[0].passed, replies
        if own_code:
            assert waited < 2.0 and trial_running  # in the gate's load, not after it
        else:
            assert waited > 2.5  # the rest of the load, and the trial's device work
        assert box.last_hold is not None and box.last_hold.to > box.last_hold.since > 0
    finally:
        box.close()


def test_a_childs_device_sections_let_the_device_go_while_triton_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The marks a gate's child writes (child/marks.py): `device` (answered) as its section starts,
    `/device` before a Triton compile and `device` (answered) after it, `/device` as the section ends;
    nested sections and compiles mark once; a compile that raised (no end) is taken back by `retake`
    before the next step on the device; the waits for answers are not the child's busy time."""
    import orjson

    from kernelbrain.child import marks
    from kernelbrain.core.protocol import GO, HEADER

    written: list[str] = []
    answers = bytearray()

    def write(frame: bytes) -> None:
        label = orjson.loads(frame[HEADER.size :])["mark"]
        written.append(label)
        if label == "device":  # the worker answers it, after a while
            time.sleep(0.05)
            answers.extend(HEADER.pack(len(GO)) + GO)

    def read(n: int) -> bytes:
        out = bytes(answers[:n])
        del answers[:n]
        return out

    monkeypatch.setattr(marks, "_write", write)  # the child's protocol pipe, as its entry point gives it
    monkeypatch.setattr(marks, "_read", read)
    marks.waited()
    with marks.on_device(), marks.on_device():
        assert marks.compile_starts(key="k") is False  # Triton compiles it
        marks.compile_starts(key="inner")
        marks.compile_ends(key="inner")
        marks.compile_ends(key="k")
    assert written == ["device", "/device", "device", "/device"]
    written.clear()
    with marks.on_device():
        marks.compile_starts(key="raises")  # and never ends
        marks.retake()
        marks.retake()
    marks.compile_starts(key="outside")  # outside a section: nothing to let go
    marks.compile_ends(key="outside")
    assert written == ["device", "/device", "device", "/device"]
    assert not answers
    assert 0.2 <= marks.waited() < 1.0 and marks.waited() == 0.0  # four answers of 0.05 s, read once


def test_only_a_lazy_hold_is_let_go_before_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rung's shared hold while it prepares is held to its end whatever its child marks (a spare's
    warm-up marks `/device`); a gate's lazy hold is let go, and taken again."""
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    lock = tmp_path / "gpu-0.lock"
    with gpu_lock.held("0", alone=False) as eager:
        eager.let_go()
        assert eager.held and _held(lock)
    with gpu_lock.held("0", alone=False, lazy=True) as lazy:
        assert not lazy.held and not _held(lock)
        lazy.take()
        with lazy.pinned():
            lazy.let_go()
            assert lazy.held and _held(lock)
        lazy.let_go()
        assert not lazy.held and not _held(lock) and lazy.held_s > 0
        with lazy.pinned():
            assert _held(lock)
        assert not _held(lock)


def test_a_gate_whose_candidate_marks_itself_ready_is_a_policy_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ready` makes a rung's hold go alone (its shared lock let go first): in a gate, where nothing is
    timed, a candidate writing it on the protocol pipe would let the device go in the middle of its
    pinned trial. The worker refuses it as the candidate's policy fault."""
    from kernelbrain.runtime.sandbox import Sandbox, SandboxFault

    here = Path(__file__).resolve().parent
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    forged = (
        (here / "candidates" / "good_softmax.py")
        .read_text()
        .replace(
            "        x = x.contiguous()\n",
            "        from kernelbrain.child import marks\n"
            "        marks.mark('ready')\n"
            "        x = x.contiguous()\n",
        )
    )
    assert "marks.mark('ready')" in forged
    request = GateRequest(
        problem_source=(here / "problems" / "softmax_small.py").read_text(),
        cand_source=forged,
        device="cpu",
        seeds=1,
    )
    box = Sandbox("cpu", fresh_untrusted=False)
    try:
        with pytest.raises(SandboxFault) as fault:
            box.call(request, timeout_s=300)
        assert fault.value.category == "policy" and "ready" in fault.value.detail
    finally:
        box.close()


def test_a_child_started_within_a_gates_lazy_hold_warms_under_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child (the judge's or the candidate's) started while a gate holds the device lazily makes its
    CUDA context at its first request, inside a section the worker answers under the lock, as a spare
    does: started warm, it would run its first kernel while a timing holds the device alone."""
    from kernelbrain.runtime.sandbox import Sandbox

    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    box = Sandbox("cuda", warm_cuda=True)
    spares: list[bool] = []

    class Spawned(Exception):
        """Where the child would start (no CUDA here): what it would warm with is recorded."""

    def spawn(self: Sandbox, spare: bool = False) -> None:
        spares.append(spare)
        raise Spawned

    monkeypatch.setattr(Sandbox, "_spawn", spawn)
    for lazy in (False, True):
        with gpu_lock.held("0", alone=False, lazy=lazy) as hold:
            box.hold = hold
            for start in (box.start, box.start_judge):
                with pytest.raises(Spawned):
                    start()
    box.hold = None
    assert spares == [False, False, True, True]
    env = box._env(tmp_path, "none", spare=True)
    assert env["KB_WARM_CUDA"] == "first"


def test_a_lazy_hold_goes_alone_untaken_and_holds_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile's hold of kb's own code is taken at its child's marks: where its first is `ready`, it goes
    alone from nothing taken, and its held seconds start there."""
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    lock = tmp_path / "gpu-0.lock"
    with gpu_lock.held("0", alone=False, lazy=True) as lazy:
        assert not lazy.held and not _held(lock)
        time.sleep(0.3)
        lazy.go_alone()
        assert lazy.alone and lazy.held and _held(lock)
        lazy.let_go()  # alone: held to the end
        assert _held(lock)
    assert not _held(lock) and lazy.held_s < 0.3


@pytest.mark.parametrize("own_code", [True, False], ids=["kbs-own", "from-outside"])
def test_a_profile_of_kbs_own_code_takes_the_device_at_its_childs_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_code: bool
) -> None:
    """While a timing holds the device alone, a roofline of kb's own code starts its child and prepares up
    to its `device` mark (ncu's start and a target's imports held the lock 20 s a profile on the H100);
    one of code from outside holds the lock from its start, as before. Both then time alone."""
    from kernelbrain.core.protocol import RooflineRequest
    from kernelbrain.runtime.sandbox import Sandbox

    here = Path(__file__).resolve().parent
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    holder = hold(tmp_path, True, None, device="cpu")
    box = Sandbox("cpu", fresh_untrusted=False)
    try:
        request = RooflineRequest(
            problem_source=(here / "problems" / "softmax_small.py").read_text(),
            cand_source=(here / "candidates" / "good_softmax.py").read_text(),
            device="cpu",
            repeats=1,
            flops=1.0,
            nbytes=1.0,
        )
        call = threading.Thread(
            target=box.call, args=(request,), kwargs={"timeout_s": 300, "own_code": own_code}
        )
        call.start()
        deadline = time.monotonic() + 120
        if own_code:  # its child runs up to the device while the timing holds it
            while box.hold is None or box.executions == 0:
                assert call.is_alive() and time.monotonic() < deadline
                time.sleep(0.05)
            assert not box.hold.held
        else:
            time.sleep(1.5)
            assert box.hold is None  # still taking the lock
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        released = float(holder.communicate(timeout=30)[0].split()[-1])
        call.join(timeout=240)
        assert not call.is_alive()
        last = box.last_hold
        assert last is not None and last.alone and last.since >= released
    finally:
        holder.kill()
        box.close()
