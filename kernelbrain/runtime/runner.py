"""Starting, supervising and resuming runs.

`start_run` records RunStarted; `supervise` starts the workers as separate processes (one a role on a
GPU, one for them all on a CPU: `roles.worker_processes`) or steps them in this process, restarts one
that dies, prints progress from the log, and returns when the scheduler records RunFinished.
SIGINT/SIGTERM stop the workers cleanly and leave the run resumable.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import ValidationError

from kernelbrain.core.errors import RunError
from kernelbrain.core.events import RunConfig, RunFinished, RungSpec, RunResumed, RunStarted
from kernelbrain.core.policy import stalled
from kernelbrain.core.problem import in_eval_mode, in_strict_fp32, read_problem, source_hash
from kernelbrain.core.state import RunState
from kernelbrain.runtime import isolation, limits
from kernelbrain.runtime.environment import without_secrets
from kernelbrain.runtime.reconnect import retrying
from kernelbrain.runtime.roles import ROLES, pool_processes, worker_processes
from kernelbrain.runtime.run_lease import RunLease
from kernelbrain.runtime.worker import Crew
from kernelbrain.store import Store, open_store
from kernelbrain.store.urls import is_url

MAX_RESTARTS = 5
# what a worker `kb run` started exits with when its database fails it at work (kb worker --supervised);
# the supervisor then checks the database itself (a write: its lease's renewal)
WORKER_STORE_EXIT = 6

DEFAULT_RUNGS = {
    # the interpreter is slow: few repeats, and every rung measures the smoke shape
    "cpu": (
        RungSpec(shapes="smallest", repeats=3, warmup=2),
        RungSpec(shapes="primary", repeats=5, warmup=2),
        RungSpec(shapes="all", repeats=7, warmup=2),
    ),
    "cuda": (
        RungSpec(shapes="smallest", repeats=10, warmup=3),
        RungSpec(shapes="primary", repeats=30, warmup=5),
        RungSpec(shapes="all", repeats=100, warmup=10),
    ),
}


def parse_ladder(text: str) -> tuple[RungSpec, ...]:
    """Rungs from `SHAPES:REPEATS[:WARMUP],...`, e.g. `smallest:10,primary:30:5,all:100:10`."""
    rungs = []
    for part in text.split(","):
        fields = part.strip().split(":")
        try:
            if len(fields) not in (2, 3):
                raise ValueError(part)
            rungs.append(
                RungSpec(
                    shapes=fields[0], repeats=int(fields[1]), warmup=int(fields[2]) if len(fields) == 3 else 1
                )
            )
        except (ValueError, ValidationError) as e:
            raise RunError(
                f"bad rung {part.strip()!r} in --ladder: write SHAPES:REPEATS[:WARMUP] with SHAPES one "
                "of smallest, primary, all (e.g. smallest:10,primary:30,all:100)"
            ) from e
    return tuple(rungs)


def detect_device() -> str:
    """cuda when this machine has an NVIDIA GPU, else cpu (no torch import: it costs seconds)."""
    return "cuda" if Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists() else "cpu"


def hardware(device: str = "cpu") -> dict:
    """The machine a run starts or resumes on, and its children's sandbox: the isolation and each limit
    (runtime/limits.py; logs older than the limits have no "limits")."""
    level = isolation.chosen()
    info: dict = {
        "host": platform.node(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "sandbox": level,
        "limits": limits.recorded(device, level).model_dump(),
    }
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(Exception):
            info["gpus"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                .stdout.strip()
                .splitlines()
            )
    return info


def versions() -> dict[str, str]:
    out = {}
    for pkg in ("kernelbrain", "torch", "triton", "pydantic", "pysqlite3"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[pkg] = importlib.metadata.version(pkg)
    from kernelbrain.store.driver import sqlite3

    out["sqlite"] = sqlite3.sqlite_version
    return out


def new_run_id() -> str:
    return time.strftime("r%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def start_run(store: Store, problem_path: str, config: RunConfig) -> str:
    source = read_problem(problem_path)
    if config.eval_mode:
        source = in_eval_mode(source)
    if config.strict_fp32:
        source = in_strict_fp32(source)
    run_id = new_run_id()
    blob = store.put_blob(source)
    assert blob == source_hash(source)
    started = RunStarted(
        problem_path=str(Path(problem_path).resolve()),
        problem_name=Path(problem_path).stem,
        problem_hash=blob,
        config=config,
        hardware=hardware(config.device),
        versions=versions(),
    )
    store.append([started.to_new(run_id, f"{run_id}/started", "cli")])
    return run_id


def require_run(store: Store, run_id: str) -> None:
    if store.count(run_id=run_id) == 0:
        raise RunError(f"no run {run_id!r} in {store.path}; `kb ls` lists the runs there")


def load_state(store: Store, run_id: str) -> RunState:
    require_run(store, run_id)
    return store.fold(RunState(run_id), run_id=run_id)


def prepare_resume(store: Store, run_id: str) -> RunState:
    """Record the next RunResumed; the run's state after it (a finished run's, with nothing recorded)."""
    state = load_state(store, run_id)
    if state.finished is not None:
        return state
    attempt = len(state.resumes) + 1
    store.append(
        [
            RunResumed(attempt=attempt, hardware=hardware(state.config.device)).to_new(
                run_id, f"{run_id}/resumed/{attempt}", "cli"
            )
        ]
    )
    return store.fold(state, run_id=run_id)


def _spawn(
    db: str, role: str, gpu: int | None, *, run_id: str | None, batch: str | None
) -> subprocess.Popen[bytes]:
    # a database URL may carry a password: it travels in the environment (KB_DB, readable by this user
    # only), never on the command line (/proc/PID/cmdline, readable by every user)
    url = is_url(db)
    where = [] if url else ["--db", db]
    serves = ["--run", run_id] if run_id is not None else ["--batch", str(batch)]
    # --supervised: the worker leaves it to this process to say that the database is lost, or failed
    cmd = [sys.executable, "-m", "kernelbrain", "worker", role, *where, *serves, "--supervised"]
    if gpu is not None:
        cmd += ["--gpu", str(gpu)]
    # a process's first environment stays readable in /proc/PID/environ: the roles that start
    # candidates' children are started without the keys the generator needs
    env = dict(os.environ) if role == "generator" else without_secrets(dict(os.environ))
    if url:
        env["KB_DB"] = db
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env)


def supervise(
    db: str,
    run_id: str,
    *,
    gpu: int | None = None,
    inprocess: bool = False,
    external: bool = False,
    progress: Callable[[RunState, int], None] | None = None,
    lease: RunLease | None = None,
) -> RunFinished | None:
    """Drive the run until RunFinished (returned) or a stop signal (returns None; the run is resumable).

    `lease`: this process's lease on the run. A StoreError stands where its renewal failed (the database
    cannot be written), or RunHeld where another process took it."""
    ended = supervise_runs(
        db, [run_id], gpu=gpu, inprocess=inprocess, external=external, progress=progress, lease=lease
    )
    return ended[run_id]


def supervise_runs(
    db: str,
    run_ids: list[str],
    *,
    batch: str | None = None,
    gpu: int | None = None,
    inprocess: bool = False,
    external: bool = False,
    progress: Callable[[RunState, int], None] | None = None,
    lease: RunLease | None = None,
) -> dict[str, RunFinished | None]:
    """Drive one run, or the runs of a batch through one pool of workers, until each has finished or
    only parked tasks are left, or a stop signal: how each ended (None: unfinished, resumable).
    `progress(state, seen)`: called for a run whose log grew past `seen`."""
    if inprocess:
        return _supervise_inprocess(db, run_ids, batch, gpu, progress, lease)
    with _stop_signals() as stop:
        return _supervise_processes(db, run_ids, batch, gpu, external, progress, stop, lease)


@contextlib.contextmanager
def _stop_signals() -> Iterator[list[int]]:
    """SIGINT/SIGTERM are only noted: the supervisor stops after the work in flight, leaving the run
    resumable (the caller exits 130), rather than dying mid-task."""
    stop: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        stop.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _ended(states: dict[str, RunState]) -> dict[str, RunFinished | None] | None:
    """How each run ended, once every one has finished or has only parked tasks left."""
    if all(s.finished is not None or stalled(s) for s in states.values()):
        return {rid: s.finished for rid, s in states.items()}
    return None


def _supervise_processes(
    db: str,
    run_ids: list[str],
    batch: str | None,
    gpu: int | None,
    external: bool,
    progress: Callable[[RunState, int], None] | None,
    stop: list[int],
    lease: RunLease | None,
) -> dict[str, RunFinished | None]:
    store = open_store(db, create=False)
    states = {rid: RunState(rid) for rid in run_ids}
    for state in states.values():  # the device decides the workers
        retrying(functools.partial(store.fold, state, run_id=state.run_id), "kb run")
    first = states[run_ids[0]].config
    if batch is None:
        names = list(worker_processes(first.device, first.generator))
    else:
        names = pool_processes(first.device, first.generator, len(os.sched_getaffinity(0)))
    slots = [f"{name}#{i}" for i, name in enumerate(names)]
    run_id = run_ids[0] if batch is None else None

    def spawn(slot: str) -> subprocess.Popen[bytes]:
        return _spawn(db, slot.split("#")[0], gpu, run_id=run_id, batch=batch)

    # external: `kb worker` processes started elsewhere (other GPUs, other shells) drive the run
    procs = {} if external else {slot: spawn(slot) for slot in slots}
    # deaths of each worker in a row with no work recorded between them (a task it keeps dying on is
    # parked by the worker after MAX_TASK_FAULTS, which is work: the worker goes on with the rest)
    restarts = dict.fromkeys(slots, 0)
    progress_at_death = dict.fromkeys(slots, -1)

    def watch() -> None:
        for state in states.values():
            seen = state.position
            store.fold(state, run_id=state.run_id)
            if progress and state.position != seen:
                progress(state, seen)

    try:
        while not stop:
            # a lost database is waited out (the workers wait it out too): fold and show again
            retrying(watch, "kb run")
            if (ended := _ended(states)) is not None:
                return ended
            if lease is not None:
                lease.check()
            done = sum(s.progress for s in states.values())
            for slot, proc in procs.items():
                code = proc.poll()
                if code is None:
                    continue
                if lease is not None:  # a write: a worker that died of its database dies of it here too
                    lease.probe()
                if done > progress_at_death[slot]:
                    restarts[slot] = 0
                progress_at_death[slot] = done
                role = slot.split("#")[0]
                if restarts[slot] >= MAX_RESTARTS:
                    again = f"kb resume {batch or run_ids[0]}"
                    raise RunError(
                        f"the {role} worker died {MAX_RESTARTS + 1} times in a row with no work recorded "
                        f"(last exit {code}); see its output above, fix, then `{again}`"
                    )
                restarts[slot] += 1
                why = " (its database failed it, and answers again)" if code == WORKER_STORE_EXIT else ""
                print(f"kb: {role} worker exited with {code}{why}; restarting it", file=sys.stderr)
                procs[slot] = spawn(slot)
            time.sleep(0.2)
        return {rid: s.finished for rid, s in states.items()}
    finally:
        _stop_workers(procs)
        store.close()


def _stop_workers(procs: dict[str, subprocess.Popen[bytes]], grace_s: float = 60.0) -> None:
    """SIGTERM: each worker finishes (or releases) its task in flight and exits; SIGKILL stragglers."""
    for proc in procs.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _supervise_inprocess(
    db: str,
    run_ids: list[str],
    batch: str | None,
    gpu: int | None,
    progress: Callable[[RunState, int], None] | None,
    lease: RunLease | None,
) -> dict[str, RunFinished | None]:
    # the roles take turns in this process: one child runs every role's candidates and one judge serves
    # them all (the analysis included), rather than a pair a role (a torch import each)
    run_id = run_ids[0] if batch is None else None
    crew = Crew(db, ROLES, run_id, batch=batch, gpu=gpu)
    try:
        with _stop_signals() as stop:
            while not stop:
                did = crew.step(lambda: bool(stop))
                states = crew.members[-1].states
                for state in states.values():
                    if progress:
                        progress(state, 0)
                if set(run_ids) <= set(states):
                    ended = _ended({rid: states[rid] for rid in run_ids})
                    if ended is not None and (not did or all(e is not None for e in ended.values())):
                        return ended
                if lease is not None:
                    lease.check()
                if not did and not stop:
                    time.sleep(0.05)
            states = crew.members[-1].states
            return {rid: states[rid].finished if rid in states else None for rid in run_ids}
    finally:
        crew.close()
