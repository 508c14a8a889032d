"""Issue 15's sweep: `kb run` on every KernelBench file of a folder, then each winner timed against eager
PyTorch and torch.compile in one process on fresh inputs.

    python tools/kernelbench_sweep.py --kernelbench DIR [--levels 1,2] [--db DB] [--out DIR]
        [--budget-gpu-s 60] [--max-candidates 8] [--time-limit-s 0] [--only REGEX]
        [--allow-torch conv,matmul]

Its state is kb's own: every problem's run lives in one database (--db), and a problem's result JSON is
written once its run has ended and its winner (if any) was timed. The files' runs go through kb's
pool: the files not started yet as one batch (`kb run A.py B.py ...`: the host's cores share the
analyses, compiles and gates, the GPU is held alone for each timing), runs left unfinished resumed by
their batch (`kb resume BATCH`). Started again, it skips what has a result, so the sweep can be spread
over device calls of 10 minutes and over days: --time-limit-s stops it in time (kb is sent SIGTERM, its
own resumable stop; so it is when the sweep itself gets SIGTERM or SIGINT, which then exits 130
without timing anything). Each winner is timed as its run ends, while the other runs go on: the
`measure` process imports and builds beside them, then holds the device alone (kb's device lock, the
one the runs' timing takes) from its first draw to its last sample.

Writes OUT/levelN/STEM.json per problem and OUT/README.md: per problem the family kb matched, what the
gate said, the winner's speedup over eager and over torch.compile, or why there is none; per level
fast_0 (a correct kernel) and fast_1 (correct and faster than eager, and than torch.compile). The
`measure` subcommand is the timing of one winner, run by the sweep in its own process.

--redo-unmatched runs again the files whose result found no template family (made before the family
existed): their old results stay until the new ones replace them. --allow-torch passes through to
`kb run`: candidates may keep those classes of torch ops (partial kernels).
A row whose winner is one is marked `[torch: conv]` in the table, and counted apart per level. A file
whose reference draws random numbers in training mode (dropout), which kb refuses as constructed, runs
again with `kb run --eval`; its row is marked `[eval]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; appended, so an installed kb comes first
    sys.path.append(str(ROOT))

from tools.h200_records import dump, load  # noqa: E402
from tools.kernelbench_runs import (  # noqa: E402
    Runs,
    batch_of,
    in_eval,
    matched,
    needs_eval,
    outcome,
    refused_in_training,
    run_for,
)
from tools.kernelbench_table import record_piece, table  # noqa: E402

# the fields of a result whose file kb refused before starting a run
REFUSED = {"run_id": None, "finished": True, "families": [], "candidates": 0, "gate_passed": 0}
REFUSED |= {"gate_failed": {}, "winner": None, "winner_family": None, "gpu_s": 0.0, "speedup": {}}
STOPPED = threading.Event()  # the sweep got SIGTERM or SIGINT: stop the runs in flight, start none
POLL_S = 2.0  # while the runs go on, how often the sweep looks for one that ended
PROGRESS_S = 60.0  # and how often it says how far the runs are (a call cut short still tells)
EXIT_PROBLEM = 4  # kb run's code for a problem file it refused (kernelbrain.views.ending)


def problem_files(kernelbench: Path, levels: list[int], only: str | None) -> list[tuple[int, Path]]:
    """(level, file) for every problem file of the levels, in KernelBench's numeric order (as `kb run
    FOLDER` takes them)."""
    from kernelbrain.runtime.batch import problem_paths

    out = []
    for level in levels:
        folder = kernelbench / f"level{level}"
        if not folder.is_dir():
            raise SystemExit(f"{folder} is not a folder: pass --kernelbench the folder holding level1, ...")
        out += [(level, p) for p in problem_paths((str(folder),)) if only is None or re.search(only, p.name)]
    return out


def level_counts(args: argparse.Namespace) -> dict[int, int]:
    """The files of each level the sweep covers (the table's `swept ... of N`)."""
    return {lv: len(problem_files(args.kernelbench, [lv], args.only)) for lv in args.levels}


def result_path(out: Path, level: int, path: Path) -> Path:
    return out / f"level{level}" / f"{path.stem}.json"


def kb_call(cmd: list[str], deadline: float) -> tuple[int, str]:
    """One `kb run` or `kb resume` until it ends, the deadline, or a stop of the sweep (SIGTERM to kb:
    its resumable stop, 130): its exit code and output."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # SIGTERM: kb stops its workers and leaves the runs resumable
    out, _, _ = finish(proc, deadline, lambda: proc.send_signal(signal.SIGTERM))
    return proc.returncode, out


def finish(proc: subprocess.Popen[str], deadline: float, stop: Callable[[], object]) -> tuple[str, str, bool]:
    """`proc`'s stdout and stderr once it ends, and whether it was stopped: at the deadline or a stop of
    the sweep, `stop` is called first."""
    while True:
        try:
            out, err = proc.communicate(timeout=0.25)  # retried, it loses no output
            return out or "", err or "", False
        except subprocess.TimeoutExpired:
            if STOPPED.is_set() or time.monotonic() >= deadline:
                stop()
                out, err = proc.communicate()
                return out or "", err or "", True


def kb_run_command(
    files: list[Path], db: Path, args: argparse.Namespace, eval_mode: bool = False
) -> list[str]:
    """`kb run` of the files (a batch where there are several), with the sweep's settings; in eval mode
    for files whose reference draws random numbers in training mode."""
    cmd = [sys.executable, "-m", "kernelbrain", "run", *map(str, files), "--db", str(db), "--quiet"]
    cmd += ["--eval"] if eval_mode else []
    cmd += ["--budget-gpu-s", str(args.budget_gpu_s), "--max-candidates", str(args.max_candidates)]
    cmd += ["--max-profiles", "1"]  # ncu for the best finalist alone: one profile a problem
    cmd += ["--device", args.device] if args.device else []
    return cmd + (["--allow-torch", args.allow_torch] if args.allow_torch else [])


def plan(files: list[Path], db: Path, args: argparse.Namespace) -> tuple[list[str], list[Path], list[Path]]:
    """What the files need: the batches or runs to resume (an older sweep's unfinished runs, a batch at a
    time, or alone where a run was started alone), the files to start as one batch, and those to start
    in eval mode (their reference draws random numbers in training mode: `needs_eval`)."""
    resume: dict[str, None] = {}  # batch or run ids, in order
    start: list[Path] = []
    start_eval: list[Path] = []
    runs = Runs.read(db)
    for path in files:
        fresh = (args.fresh is not None and re.search(args.fresh, path.name)) or path in args.stale
        newest = runs.run_for(path)
        run_id = None if fresh else newest
        if run_id is not None and args.redo_unmatched and not matched(db, run_id):
            run_id = None  # the newest run found no family: kb of today starts a new one
        if run_id is not None and run_id in runs.finished and needs_eval(db, run_id):
            start_eval.append(path)  # refused in training mode: its run in eval mode is next
        elif run_id is None:
            (start_eval if newest is not None and in_eval(db, newest) else start).append(path)
        elif run_id not in runs.finished:
            resume[batch_of(db, run_id) or run_id] = None
    return list(resume), start, start_eval


def drive(
    resume: list[str],
    start: list[Path],
    start_eval: list[Path],
    db: Path,
    args: argparse.Namespace,
    deadline: float,
) -> dict[Path, str]:
    """The runs through kb's pool: `resume` resumed, then `start` started as one batch, then in eval mode
    `start_eval` and the files of `start` whose reference draws random numbers in training mode. Per
    file, kb's line where it refused the file (no run was started)."""
    kb = [sys.executable, "-m", "kernelbrain"]
    for ident in resume:
        if time.monotonic() < deadline and not STOPPED.is_set():
            kb_call([*kb, "resume", ident, "--db", str(db), "--quiet"], deadline)
    refused: dict[Path, str] = {}
    for eval_mode in (False, True):
        files = start if not eval_mode else [*start_eval, *(p for p in start if refused_in_training(db, p))]
        if not files or time.monotonic() >= deadline or STOPPED.is_set():
            continue
        code, out = kb_call(kb_run_command(files, db, args, eval_mode), deadline)
        lines = out.strip().splitlines()
        if len(files) == 1 and code == EXIT_PROBLEM and run_for(db, files[0]) is None:
            refused[files[0]] = lines[-1]  # kb run of one file: not a batch; its `Error:` line
        for path in files:  # a batch's refusals: `NAME: refused: LINE`
            said = f"{path.name}: refused: "
            for line in lines:
                if line.startswith(said):
                    refused[path] = line.removeprefix(said)
    return refused


def _stale(path: Path) -> bool:
    """A result whose kb code (code_hash of its family) is not today's: made before a change to it."""
    if not path.exists():
        return False
    result = json.loads(path.read_text())
    return result.get("code") != result_code(result)


def _unmatched(path: Path) -> bool:
    """A result file recording no template family: made before the file's family existed, or a miss."""
    return path.exists() and not json.loads(path.read_text()).get("families")


BASELINES = ("eager", "compile", "compile_max")  # what a user has: eager PyTorch, torch.compile's modes


def measure_winner(problem_file: Path, db: Path, run_id: str, out: Path, repeats: int, device: str) -> None:
    """The winner, eager PyTorch, torch.compile (default) and torch.compile(mode="max-autotune-no-
    cudagraphs") in this process, on the same fresh inputs at the file's own shape, timed interleaved
    (tools/h200_compare.side_by_side, its draws sized to the device's free memory). On a CPU only the
    default mode (compile_warm.modes). On a GPU their kernels are compiled first beside the runs
    (tools/compile_warm), so that the device is held alone for what must be: autotuning and timing."""
    import torch
    from kernelbrain.store import open_store

    from kernelbrain.child.loading import Problem, build, load_module
    from kernelbrain.core.problem import in_eval_mode
    from kernelbrain.runtime.role import problem_need
    from kernelbrain.runtime.runner import load_state
    from tools.compile_warm import modes, shared_triton_cache, warm
    from tools.h200_compare import side_by_side

    with open_store(str(db), create=False, readonly=True) as store:
        state = load_state(store, run_id)
        assert state.finished is not None and state.finished.winner, f"{run_id} has no winner"
        assert state.started is not None
        source = store.get_blob(state.candidates[state.finished.winner].proposal.source).decode()
        # the problem as the run recorded it (`kb run --eval` marks it so): the reference in its mode
        problem_source = store.get_blob(state.started.problem_hash).decode()
        problem_source = in_eval_mode(problem_source) if state.eval_mode else problem_source
    warmed = None
    if device == "cuda":
        shared_triton_cache()
        warmed = warm(problem_source, source, device, problem_need(state))
    problem = Problem(problem_source)
    shape = problem.shapes[0]
    ref, _ = build(problem, None, shape, device)
    _, new = build(problem, load_module(source, "winner"), shape, device)
    fns = {"eager": ref, "kb": new}
    fns |= {
        key: torch.compile(build(problem, None, shape, device)[0], mode=m) for key, m in modes(device).items()
    }
    compare = lambda: side_by_side(problem, shape, device, fns, repeats, problem_file.stem)  # noqa: E731
    (rows, calls, draws), hold, attempts = timed_alone(compare, device, problem_need(state))
    timing = {"shape": "file's own", "calls": calls, "draws": draws, "repeats": repeats, "device": device}
    timing |= {"alone": [hold.since, hold.to], "attempts": attempts}
    if warmed is not None:  # the cold first calls, made beside the runs
        timing["warm"] = warmed
    dump(out, {**timing, "gpu": gpu_info(device), "times": rows})


TIMING_ATTEMPTS = 3  # a timing that runs out of memory beside the runs' children is tried this often
EXIT_BUSY = 75  # `measure`'s code where the device stayed too full to time on: the next sweep times it


def timed_alone(timing: Callable[[], Any], device: str, need: Any) -> tuple[Any, Any, int]:
    """`timing`'s answer, its hold of the device lock (alone from the first draw to the last sample: the
    compiles autotune by timing, and no run's child may start to allocate beside draws sized to the free
    memory) and the attempts it took. It first reserves the problem's memory (`need`, its analysis'
    footprint) beside the runs' reservations (runtime/device_room.py), as their benches do: it waits
    there, not holding the device, while their prepared benches hold memory. An out-of-memory error while
    other processes held part of the device is kb's fault, never the problem's: tried again after a
    pause, and after TIMING_ATTEMPTS the process exits EXIT_BUSY with one line saying so.
    KB_INJECT_TIMING_OOM (a file holding a count) injects such errors on a CPU, as KB_INJECT_OOM does
    for the runs' benches."""
    import gc

    import torch

    from kernelbrain.child.memory import DeviceBusy, injected, verdict
    from kernelbrain.runtime import device_room, gpu_lock

    name = gpu_lock.device_name(device, None)
    for attempt in range(1, TIMING_ATTEMPTS + 1):
        try:
            with device_room.on_device(name, need, alone=True) as hold:
                injected("KB_INJECT_TIMING_OOM")
                answer = timing()
            return answer, hold, attempt
        except torch.OutOfMemoryError as e:
            busy = verdict(e, "timing")
            if not isinstance(busy, DeviceBusy):
                raise  # too big for the device even alone: the problem's own, reported as an error
        gc.collect()  # out of the except clause: its traceback no longer holds the draws
        if device == "cuda":
            torch.cuda.empty_cache()
            time.sleep(5 * attempt)  # the runs' children hand their cached memory back after each request
    print(f"{busy}{_holders(device)}, {TIMING_ATTEMPTS} attempts (kb's fault)", file=sys.stderr)
    raise SystemExit(EXIT_BUSY)


def _holders(device: str) -> str:
    """The other processes on the device and the most one of them held, from nvidia-smi (empty on a CPU)."""
    if device != "cuda":
        return ""
    q = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits", "-i", "0"]
    try:
        out = subprocess.run(q, capture_output=True, text=True, timeout=30).stdout
        used = [float(line.split(",")[1]) for line in out.splitlines() if line.strip()]
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return ""
    return f" ({len(used)} processes, the largest {max(used, default=0) / 1024:.1f} GiB)"


def gpu_info(device: str) -> dict[str, str]:
    """The card (nvidia-smi's name and driver) or the CPU a timing ran on."""
    if device != "cuda":
        return {"name": "cpu", "driver": ""}
    q = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"]
    try:
        name, driver = subprocess.run(q, capture_output=True, text=True, timeout=30).stdout.split(",")[:2]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {"name": "unknown GPU", "driver": ""}
    return {"name": name.strip(), "driver": driver.strip()}


def gpu_slug(info: dict[str, str]) -> str:
    """A folder name for a card: `nvidia-h100-80gb-hbm3`, `nvidia-h200`, `cpu`."""
    return re.sub(r"[^a-z0-9]+", "-", info["name"].lower()).strip("-") or "unknown"


def code_hash(family: str | None) -> str:
    """The hash of the kb code that decides a result of this family: the family's own templates, what
    every family shares (templates' base, composer, match), the generator, the gate and judge, the timing,
    the scheduler's policy. A later sweep runs again the rows whose hash changed."""
    kb = ROOT / "kernelbrain"
    shared = [*kb.glob("templates/*.py"), *kb.glob("templates/compose/*.py"), *kb.glob("generators/*.py")]
    shared += [kb / "child" / f for f in ("gate.py", "judge.py", "draws.py", "timing.py", "analysis.py")]
    shared += [kb / "child" / f for f in ("loading.py", "tolerance.py")]  # the reference as built, the bound
    shared += [kb / "core" / f for f in ("policy.py", "scoring.py", "graph.py")]
    own = sorted((kb / "templates" / "families" / family).rglob("*.py")) if family else []
    digest = hashlib.sha256()
    for f in [*sorted(shared), *own]:
        if f.exists():
            digest.update(f.relative_to(ROOT).as_posix().encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def result_code(result: dict[str, Any]) -> str:
    """The code hash a result is judged by: its winner's family, else the first family it matched."""
    family = result.get("winner_family") or next(iter(result.get("families") or []), None)
    return code_hash(family if family and family != "partial" else None)


def timed(problem_file: Path, db: Path, run_id: str, args: argparse.Namespace, deadline: float) -> dict:
    """The `measure` subcommand in its own process (a crash or an OOM there is this problem's only)."""
    scratch = Path(tempfile.mkdtemp(prefix="kb-sweep-")) / f"{problem_file.stem}.json"
    cmd = [sys.executable, __file__, "measure", str(problem_file), "--db", str(args.db), "--run", run_id]
    cmd += ["--to", str(scratch), "--repeats", str(args.repeats), "--device", args.device or _device()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err, stopped = finish(proc, deadline, proc.kill)
    if stopped:  # timed again by the next sweep
        return {"error": "timing did not finish before the sweep's time limit or its stop"}
    tail = (err.strip().splitlines() or ["no output"])[-1]
    if proc.returncode == EXIT_BUSY:  # kb's fault, not the problem's: timed again by the next sweep
        return {"error": tail[:300], "busy": True}
    if proc.returncode != 0 or not scratch.exists():
        return {"error": f"timing failed (exit {proc.returncode}): {tail[:300]}"}
    return load(scratch)


def _device() -> str:
    from kernelbrain.runtime.runner import detect_device

    return detect_device()


def speedups(result: dict) -> dict:
    """The winner's speedup over each baseline timed beside it, and over the best of them (named)."""
    t = result.get("timing", {}).get("times", {})
    kb = t.get("kb", {}).get("median_s")
    medians = {k: t[k]["median_s"] for k in BASELINES if t.get(k, {}).get("median_s")}
    out: dict[str, Any] = {f"vs_{k}": (medians[k] / kb if kb and k in medians else None) for k in BASELINES}
    best = min(medians, key=lambda k: medians[k]) if medians else None
    out |= {"best_baseline": best, "vs_best": medians[best] / kb if kb and best else None}
    if result.get("winner") and out["vs_eager"] is not None and out["vs_eager"] <= 1 and "miss" not in result:
        result["miss"] = f"slower than eager ({out['vs_eager']:.2f}x)"
    return out


def sweep(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + args.time_limit_s if args.time_limit_s else float("inf")
    # runs stop this much before the limit, so the winners of the runs that ended are timed within it
    reserve = min(args.timing_reserve_s, args.time_limit_s / 3)
    runs_until = deadline - reserve if args.time_limit_s else deadline
    files = problem_files(args.kernelbench, args.levels, args.only)
    if args.fresh is not None:  # results to redo: their files run again from scratch
        for lv, p in files:
            if re.search(args.fresh, p.name):
                result_path(args.out, lv, p).unlink(missing_ok=True)
    # results decided by kb code that has changed since: their files run again (new runs), the old
    # results kept until replaced
    args.stale = {p for lv, p in files if _stale(result_path(args.out, lv, p))}
    args.measured = []  # the spans each winner's timing held the device alone
    todo = [
        (lv, p)
        for lv, p in files
        if not result_path(args.out, lv, p).exists()
        or (args.redo_unmatched and _unmatched(result_path(args.out, lv, p)))
        or p in args.stale
    ]
    stale = f" ({len(args.stale)} decided by kb code changed since)" if args.stale else ""
    print(
        f"{len(files)} problem files, {len(files) - len(todo)} done earlier, {len(todo)} to go{stale}; "
        f"on {args.gpu['name']}",
        flush=True,
    )
    began = time.time()
    args.out.mkdir(parents=True, exist_ok=True)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: STOPPED.set())
    resume, start, start_eval = plan([p for _, p in todo], args.db, args)
    # a file started anew counts only its new run: the one it had (stale, unmatched, --fresh) is not it
    before = Runs.read(args.db)
    old = {path: before.run_for(path) for path in [*start, *start_eval]}
    refused: dict[Path, str] = {}
    runner = threading.Thread(
        target=lambda: refused.update(drive(resume, start, start_eval, args.db, args, runs_until)),
        daemon=True,
    )
    runner.start()
    left = list(todo)
    said = time.monotonic()
    while runner.is_alive():  # each winner timed as its run ends, while the other runs go on
        runs = Runs.read(args.db)  # one read a poll, whatever the number of files
        left = [row for row in left if not settle(*row, runs, old, refused, args, deadline, ended_only=True)]
        runner.join(timeout=POLL_S)
        if time.monotonic() - said >= PROGRESS_S:
            said = time.monotonic()
            print(progress(args.db, began), flush=True)
    runs = Runs.read(args.db)
    for row in left:
        settle(*row, runs, old, refused, args, deadline, ended_only=False)
    record_piece(args, began, len(todo))
    table(args, level_counts(args))
    if STOPPED.is_set():
        print("stopped by a signal: the same command goes on where this one stopped", flush=True)
        raise SystemExit(130)


def progress(db: Path, began: float) -> str:
    """One line on the runs so far: what was gated, measured and ended, the faults, the seconds the GPU
    was held alone since the sweep began (BudgetCharged's spans), and what the tasks waited for its
    memory and its lock (BudgetCharged's waits: where the pool's time goes, tools/timed_spans.py)."""
    from kernelbrain.store import open_store

    from kernelbrain.views.batch import alone_spans
    from tools.timed_spans import waits

    kinds = ["GatePassed", "GateFailed", "RungBenchmarked", "RunFinished", "TaskFaulted", "BudgetCharged"]
    with open_store(str(db), create=False, readonly=True) as store:
        events = [e for e in store.read(types=kinds) if e.ts >= began]
    n = {k: sum(e.type == k for e in events) for k in kinds}
    alone = sum(b - a for device in alone_spans(events).values() for a, b, _ in device)
    room, lock = (sum(w[k] for w in waits(events).values()) for k in ("room_s", "lock_s"))
    return (
        f"[{time.time() - began:.0f} s] gates {n['GatePassed']} passed, {n['GateFailed']} failed; "
        f"rungs {n['RungBenchmarked']}; runs ended {n['RunFinished']}; faults {n['TaskFaulted']}; "
        f"GPU held alone {alone:.0f} s; tasks waited {room:.0f} s for memory, {lock:.0f} s for the lock"
    )


def settle(
    level: int,
    path: Path,
    runs: Runs,
    old: dict[Path, str | None],
    refused: dict[Path, str],
    args: argparse.Namespace,
    deadline: float,
    *,
    ended_only: bool,
) -> bool:
    """The file's result written, its winner timed first (`measure`, holding the device alone while it
    times: the runs still going wait), where its run has ended; whether the file needs no more from this
    sweep. `runs`: the database as last read. `ended_only`: while the runs go on, a file whose run has
    not ended waits."""
    run_id = runs.run_for(path)
    if run_id is not None and path in old and run_id == old[path]:
        run_id = None  # not started anew yet
    result: dict[str, Any] = {"level": level, "problem": path.stem, "file": f"level{level}/{path.name}"}
    if run_id is None:
        if ended_only:
            return False
        if path in refused:  # kb refused the file before recording a run: its line says why
            print(f"level{level}/{path.name}: kb refused it: {refused[path][:160]}", flush=True)
            result |= {**REFUSED, "miss": f"kb refused the file: {refused[path]}", "gpu": args.gpu}
            result["code"] = result_code(result)
            dump(result_path(args.out, level, path), result)
        return True  # not started: the time limit, or a stop
    ended = run_id in runs.finished
    if ended_only and not ended:
        return False
    if ended and needs_eval(args.db, run_id):  # its run in eval mode comes next, here or next time
        return not ended_only
    print(f"level{level}/{path.name}: {'ended' if ended else 'stopped, resumable'} ({run_id})", flush=True)
    result |= outcome(args.db, run_id)
    if not result["finished"]:
        return True  # stopped by the time limit: resumed next time
    result |= {"gpu": args.gpu, "code": result_code(result)}
    if result["winner"]:
        if time.monotonic() >= deadline or STOPPED.is_set():
            return True  # timed by the next sweep (its run is finished: nothing is run again)
        result["timing"] = timed(path, args.db, run_id, args, deadline)
        if "error" in result["timing"] and "the sweep's time limit" in result["timing"]["error"]:
            return True
        if result["timing"].get("busy"):  # no result: the next sweep times it (its run is not run again)
            said = f"level{level}/{path.name}: {result['timing']['error']}; timed by the next sweep"
            print(said, flush=True)
            return True
        if alone := result["timing"].get("alone"):
            args.measured.append(alone)
    result["speedup"] = speedups(result)
    dump(result_path(args.out, level, path), result)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    m = sub.add_parser("measure", help="time one finished run's winner (the sweep runs it)")
    m.add_argument("problem", type=Path)
    m.add_argument("--db", type=Path, required=True)
    m.add_argument("--run", required=True)
    m.add_argument("--to", type=Path, required=True)
    m.add_argument("--repeats", type=int, default=20)
    m.add_argument("--device", default="cuda")
    ap.add_argument("--kernelbench", type=Path, help="the folder holding level1/, level2/, ...")
    ap.add_argument("--levels", default="1,2", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--db", type=Path, default=None, help="default: OUT/sweep.db")
    ap.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/results/kernelbench/GPU (the card's name)"
    )
    ap.add_argument("--budget-gpu-s", type=float, default=60.0, help="per problem")
    ap.add_argument("--max-candidates", type=int, default=8)
    ap.add_argument("--time-limit-s", type=float, default=0.0, help="stop in time (0: none)")
    ap.add_argument("--repeats", type=int, default=20, help="timed samples per contender")
    ap.add_argument(
        "--timing-reserve-s", type=float, default=150.0, help="of the time limit, kept for timing winners"
    )
    ap.add_argument("--device", default=None, help="cuda or cpu (default: what this machine has)")
    ap.add_argument("--only", default=None, help="only files whose name matches this regex")
    ap.add_argument(
        "--allow-torch", default="", help="classes of torch ops candidates may keep (kb run --allow-torch)"
    )
    ap.add_argument("--fresh", default=None, help="start new runs for files matching this regex")
    ap.add_argument(
        "--redo-unmatched",
        action="store_true",
        help="run again the files whose result found no template family (kept until replaced)",
    )
    ap.add_argument("--table-only", action="store_true", help="rewrite README.md from the JSON files")
    args = ap.parse_args()
    if args.cmd == "measure":
        measure_winner(args.problem, args.db, args.run, args.to, args.repeats, args.device)
        return
    if args.kernelbench is None:
        ap.error("--kernelbench DIR is required")
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    args.gpu = gpu_info(args.device or _device())  # results are kept per card: timings compare on one
    args.out = args.out or ROOT / "benchmarks" / "results" / "kernelbench" / gpu_slug(args.gpu)
    args.db = args.db or args.out / "sweep.db"
    if args.table_only:
        table(args, level_counts(args))
    else:
        sweep(args)


if __name__ == "__main__":
    main()
