"""Admission by memory on one device (runtime/device_room.py): what prepares and times a problem waits
while the problems reserved beside it would overfill the device, is admitted alone whatever its size,
goes largest first, and is never held up by a reservation of a process that is gone."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernelbrain.runtime import device_room
from kernelbrain.runtime.device_room import Need

GIB = 2**30


@pytest.fixture(autouse=True)
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KB_LOCKS", str(tmp_path))
    return tmp_path


def admitted_in_order(needs: list[float], first: float, capacity: float) -> list[float]:
    """Reservations of `needs` GiB (started in that order, each once the last waits) while one of
    `first` GiB is held; the order they were admitted in, once it is let go."""
    order: list[float] = []
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with device_room.reserved("0", Need(bytes=first * GIB, capacity=capacity * GIB)):
            held.set()
            release.wait(30)

    def waiter(gib: float) -> None:
        with device_room.reserved("0", Need(bytes=gib * GIB, capacity=capacity * GIB)):
            order.append(gib)
            time.sleep(0.2)  # held a while: the next admitted sees it

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert held.wait(30)
    for i, gib in enumerate(needs):
        threads.append(threading.Thread(target=waiter, args=(gib,)))
        threads[-1].start()
        deadline = time.monotonic() + 30
        while len(device_room.reservations("0")["waiting"]) < i + 1:  # waiting before the next comes
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert order == [], "admitted beside a reservation the device cannot hold with it"
    release.set()
    for t in threads:
        t.join(30)
    return order


def test_a_problem_waits_while_the_device_cannot_hold_it_beside_the_others_and_the_largest_goes_first():
    # 50 GiB held on a 72 GiB share: neither 30 nor 45 fits beside it; once it goes, 45 first though 30
    # came first, then 30 (they do not fit together either: 30 waits for 45 to end)
    assert admitted_in_order([30, 45], first=50, capacity=72) == [45, 30]


def test_one_that_fits_goes_before_the_largest_until_the_largest_has_waited_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """30 GiB held on a 72 GiB share, 45 waits for it: 2 GiB fit now and go before it; once the 45 has
    waited OVERTAKE_S, the next 2 GiB wait behind it, but a fitted gate's 0.5 GiB (SMALL_SHARE) still
    goes."""
    monkeypatch.setattr(device_room, "OVERTAKE_S", 1.5)
    release = threading.Event()
    order: list[float] = []

    def take(gib: float, hold_s: float | None = None) -> None:
        with device_room.reserved("0", Need(bytes=gib * GIB, capacity=72 * GIB)):
            order.append(gib)
            release.wait(30) if hold_s is None else time.sleep(hold_s)

    held = threading.Thread(target=take, args=(30,))
    held.start()
    while device_room.reservations("0")["held"] != [30 * GIB]:
        time.sleep(0.01)
    largest = threading.Thread(target=take, args=(45, 0.1))
    largest.start()
    while device_room.reservations("0")["waiting"] != [45 * GIB]:
        time.sleep(0.01)
    with device_room.reserved("0", Need(bytes=2 * GIB, capacity=72 * GIB)) as waited:
        assert waited < 1.0  # overtook the 45
    time.sleep(1.6)
    with device_room.reserved("0", Need(bytes=GIB / 2, capacity=72 * GIB)) as waited:
        assert waited < 1.0  # small: overtakes however long the 45 has waited
    late = threading.Thread(target=take, args=(2, 0.0))
    late.start()
    time.sleep(0.5)
    assert order == [30]  # the late one waits behind the 45, which waits for the 30
    release.set()
    for t in (held, largest, late):
        t.join(30)
    assert order == [30, 45, 2]


def test_the_largest_goes_beside_small_ones_as_if_alone() -> None:
    admitted = threading.Event()

    def largest() -> None:
        with device_room.reserved("0", Need(bytes=72 * GIB, capacity=72 * GIB)):
            admitted.set()

    with device_room.reserved("0", Need(bytes=GIB, capacity=72 * GIB)):  # a gate's
        t = threading.Thread(target=largest, daemon=True)
        t.start()
        assert admitted.wait(5)  # beside a large one it would wait (admitted_in_order's tests)
    t.join(5)


def test_beside_small_ones_the_largest_waits_while_they_and_the_contexts_would_pass_the_card(
    locks: Path,
) -> None:
    """As if alone means up to the whole card (72 GiB of share, 80 GiB of card), the children's CUDA
    contexts counted: 8 GiB of them beside a 1 GiB gate leave no room for 72 GiB; once the gate goes, the
    72 GiB goes alone."""
    pids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(11)]
    try:
        for proc in pids:  # 11 x 0.75 GiB
            device_room.counted(proc, "cuda", 0)
        admitted = threading.Event()

        def largest() -> None:
            with device_room.reserved("0", Need(bytes=72 * GIB, capacity=72 * GIB)):
                admitted.set()

        t = threading.Thread(target=largest, daemon=True)
        with device_room.reserved("0", Need(bytes=GIB, capacity=72 * GIB)):  # a gate's
            t.start()
            assert not admitted.wait(1.0)  # 72 + 1 + 8.25 > 80
        assert admitted.wait(5)  # alone
        t.join(5)
    finally:
        for proc in pids:
            proc.kill()
            proc.wait(10)


def test_problems_that_fit_together_are_admitted_together() -> None:
    capacity = Need(bytes=10 * GIB, capacity=72 * GIB)
    with device_room.reserved("0", capacity) as waited_first:
        start = time.monotonic()
        with device_room.reserved("0", capacity) as waited:
            assert waited < 1.0 and time.monotonic() - start < 1.0 and waited_first < 1.0


def test_a_problem_alone_is_admitted_whatever_its_size(locks: Path) -> None:
    with device_room.reserved("0", Need(bytes=500 * GIB, capacity=72 * GIB)) as waited:
        assert waited < 1.0
        assert device_room.reservations("0") == {"held": [500 * GIB], "waiting": []}
    assert device_room.reservations("0") == {"held": [], "waiting": []}


def test_a_reservation_of_a_killed_process_holds_nothing_up(locks: Path) -> None:
    code = (
        "import os, sys, time\n"
        "from kernelbrain.runtime import device_room\n"
        f"need = device_room.Need(bytes=60 * {GIB}, capacity=72 * {GIB})\n"
        "with device_room.reserved('0', need):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        other.kill()  # SIGKILL: its entry stays in the file
        other.wait(10)
        assert json.loads((locks / "gpu-0.room").read_text())["held"]  # still in the file
        assert device_room.reservations("0")["held"] == []  # and holding nothing
        with device_room.reserved("0", Need(bytes=60 * GIB, capacity=72 * GIB)) as waited:
            assert waited < 1.0
    finally:
        other.kill()


def test_an_unknown_need_reserves_nothing(locks: Path) -> None:
    assert device_room.need(0.0, 80 * GIB) is None and device_room.need(GIB, 0.0) is None
    assert device_room.need(GIB, 80 * GIB) == Need(bytes=GIB, capacity=0.9 * 80 * GIB)
    with device_room.reserved("0", None) as waited:
        assert waited == 0.0
    assert not (locks / "gpu-0.room").exists()


def test_a_shared_hold_waiting_for_room_never_blocks_a_timing_going_alone(locks: Path) -> None:
    """A bench holds room and its lock shared, then goes alone to time; another process wants room for a
    shared hold meanwhile (the sweep's compile warm-up did, lock first: piece 2 of the H100 sweep stood
    still). Room first, it waits holding nothing: the bench times, lets go, and then it runs."""
    code = (
        "import sys, time\n"
        "from kernelbrain.runtime import device_room\n"
        f"need = device_room.Need(bytes=60 * {GIB}, capacity=72 * {GIB})\n"
        "with device_room.on_device('0', need, alone=False) as hold:\n"
        "    print('prepared', flush=True)\n"
        "    time.sleep(float(sys.argv[1]))\n"
        "    hold.go_alone()\n"
        "    print('timed', flush=True)\n"
    )
    bench = subprocess.Popen([sys.executable, "-c", code, "1.0"], stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout is not None and bench.stdout.readline().strip() == "prepared"
        warm = subprocess.Popen([sys.executable, "-c", code, "0"], stdout=subprocess.PIPE, text=True)
        try:
            out, _ = warm.communicate(timeout=30)  # a deadlock stands still: the timeout fails the test
            assert out.split() == ["prepared", "timed"]
            assert bench.wait(10) == 0 and bench.stdout.read().split() == ["timed"]
        finally:
            warm.kill()
    finally:
        bench.kill()


def test_on_device_records_the_wait_for_memory(locks: Path) -> None:
    held = threading.Event()
    done = threading.Event()

    def other() -> None:
        with device_room.reserved("0", Need(bytes=60 * GIB, capacity=72 * GIB)):
            held.set()
            done.wait(10)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert held.wait(10)
        threading.Timer(1.0, done.set).start()
        with device_room.on_device("0", Need(bytes=60 * GIB, capacity=72 * GIB), alone=False) as got:
            assert 0.8 < got.room_s < 10.0 and got.lock_s < 0.5
    finally:
        done.set()
        t.join(10)


def test_the_childrens_cuda_contexts_count_against_what_problems_reserve_side_by_side() -> None:
    """Twenty live children with CUDA contexts (0.75 GiB each, 15 GiB) on a 72 GiB share: 40 GiB held
    leaves room for 25 beside it with no contexts (65), not with them (80); once they die, the 25 goes.
    A request alone is admitted whatever the contexts hold."""

    class Child:  # a sandbox child's process, as device_room.counted sees it
        def __init__(self) -> None:
            self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            self.pid = self.proc.pid

    children = [Child() for _ in range(20)]
    try:
        assert device_room.counted(children[0], "cpu", None) is children[0]  # a CPU has no contexts
        assert device_room.contexts("0") == 0.0
        for c in children:
            device_room.counted(c, "cuda", 0)
        assert device_room.contexts("0") == 20 * device_room.CONTEXT_BYTES == 15 * GIB
        with device_room.reserved("0", Need(bytes=50 * GIB, capacity=72 * GIB)) as waited:
            assert waited < 1.0  # alone
        admitted = threading.Event()

        def beside() -> None:
            with device_room.reserved("0", Need(bytes=25 * GIB, capacity=72 * GIB)):
                admitted.set()

        with device_room.reserved("0", Need(bytes=40 * GIB, capacity=72 * GIB)):
            t = threading.Thread(target=beside, daemon=True)
            t.start()
            assert not admitted.wait(1.0)  # 40 + 25 + 15 > 72: waits
            for c in children:
                c.proc.kill()
                c.proc.wait(10)
            assert admitted.wait(10)  # their contexts gone: 65 fits in 72
        t.join(10)
        assert device_room.contexts("0") == 0.0
    finally:
        for c in children:
            c.proc.kill()


@pytest.mark.parametrize("recorded", [True, False])
def test_each_role_reserves_its_own_count_of_the_problems_memory(recorded: bool) -> None:
    """A bench reserves the footprint (five input copies), a gate its fitted shapes' count, a profile one
    run at the primary shape; a run analysed before profiles were counted reserves the bench's for them."""
    from kernelbrain.store import StoredEvent

    from kernelbrain.core.events import ProblemAnalysed
    from kernelbrain.core.state import RunState
    from kernelbrain.runtime.role import gate_need, problem_need, profile_need
    from kernelbrain.runtime.roles.profiler import ProfilerRole

    analysis = ProblemAnalysed(
        ops=[],
        families=[],
        flops=0.0,
        bytes=0.0,
        shapes=[],
        footprint=42 * GIB,
        gate_footprint=0.2 * GIB,
        profile_footprint=18 * GIB if recorded else 0.0,
        device_memory=80 * GIB,
    )
    state = RunState("r")
    state.apply(StoredEvent(1, "r", "ProblemAnalysed", 4, "k1", analysis.model_dump(), "t", None, None, 1.0))
    capacity = device_room.ADMIT_SHARE * 80 * GIB
    assert problem_need(state) == Need(bytes=42 * GIB, capacity=capacity)
    assert gate_need(state) == Need(bytes=0.2 * GIB, capacity=capacity)
    profile = Need(bytes=(18 if recorded else 42) * GIB, capacity=capacity)
    assert profile_need(state) == profile
    assert ProfilerRole.need(ProfilerRole.__new__(ProfilerRole), state) == profile  # the roofline's too


def test_a_probe_says_whether_a_request_would_go_now_and_reserves_nothing(locks: Path) -> None:
    """`fits_now` answers as `reserved` would admit a request made now: beside 40 GiB held on a 72 GiB
    share, 20 GiB yes and 40 no; behind a largest that has waited past OVERTAKE_S, one that is not small
    no, a fitted gate's yes. It leaves no entry."""
    share = 72 * GIB
    assert device_room.fits_now("0", Need(bytes=500 * GIB, capacity=share))  # alone: whatever its size
    assert device_room.fits_now("0", None)
    release = threading.Event()
    held = threading.Event()

    def hold(gib: float, since: threading.Event, until: threading.Event) -> None:
        with device_room.reserved("0", Need(bytes=gib * GIB, capacity=share)):
            since.set()
            until.wait(30)

    first = threading.Thread(target=hold, args=(40, held, release), daemon=True)
    first.start()
    assert held.wait(5)
    assert device_room.fits_now("0", Need(bytes=20 * GIB, capacity=share))
    assert not device_room.fits_now("0", Need(bytes=40 * GIB, capacity=share))
    largest_in = threading.Event()
    largest = threading.Thread(target=hold, args=(50, largest_in, release), daemon=True)
    largest.start()  # waits: 40 + 50 > 72
    deadline = time.monotonic() + 5
    while not device_room.reservations("0")["waiting"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert device_room.fits_now("0", Need(bytes=20 * GIB, capacity=share))  # it has waited less than 10 s

    def age(room: dict) -> bool:  # as if it had waited past OVERTAKE_S (under the room's lock)
        (entry,) = room["waiting"].values()
        entry["since"] -= device_room.OVERTAKE_S + 1
        return True

    device_room.change("0", age)
    assert not device_room.fits_now("0", Need(bytes=20 * GIB, capacity=share))
    assert device_room.fits_now("0", Need(bytes=GIB, capacity=share))  # small: 2% of 72 GiB or less
    assert device_room.reservations("0") == {"held": [40 * GIB], "waiting": [50 * GIB]}
    release.set()
    first.join(5)
    largest.join(5)
    assert largest_in.is_set()
