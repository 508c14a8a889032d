"""Issue 20: what several GPUs of one host buy one search. The same search (problem, seed, ladder and
candidate count: the expert generator's round 0 is fixed, so with --max-candidates no larger than it
every N meets the same candidates) runs once per N in --gpus, each on a fresh store, driven by workers
this tool starts: one gatekeeper, one benchmarker and one profiler per GPU (`--gpu i`), one generator
(on GPU 0: it traces the reference on the run's device) and one scheduler.

    python tools/scaling_bench.py PROBLEM.py [--gpus 1,2,4] [--device cuda|cpu] [--db TEMPLATE]
        [--out benchmarks/results/scaling] [--max-candidates 12] [--ladder SPEC] [--seed 0]
        [--timing-noise [--noise-repeats 5]]

From each run's log (read through kb's own store, fold and roles, never by a query of its own) it
computes per N: candidates through the gate and rung measurements per minute of the run's wall time
(RunStarted to RunFinished), per GPU the busy share (the sandboxed children's busy seconds, which every
task's BudgetCharged records, of the workers placed on that GPU, over the wall; the worker is the
event's actor, role@host:pid:start, and this tool knows which pid it started with which --gpu), the
wall time to the winner, the scheduler's decision latency (a decision's append time minus that of its
basis, the last event it rests on), the claim latency (a task's TaskClaimed time minus the time of the
event after which its role's own task list first named it: the log folded event by event through
RunState and each role's `tasks`), and scaling efficiency = throughput_N / (N x throughput_1). Where
the time went: per GPU and role the task time split into the child's busy time, waiting for the GPU
lock and the sandbox round trip, and kb's own bookkeeping (claim to result minus the consultation);
the Triton compile seconds of the rungs; and the share of the run during which some rung task waited
for a benchmarker (low with idle benchmarkers: the generator, gate or scheduler starve them; high:
claims are slow). On CUDA, nvidia-smi's utilisation per GPU is sampled beside it.

--timing-noise answers whether timings stay honest beside busy GPUs: the N=1 run's winner is timed at
its top rung on GPU 0 through the benchmarker's own request and sandbox (the rung's code path), in
alternating samples with GPUs 1..max(N)-1 idle and busy (each looping the same rung), and the medians,
their spread and the shift are reported.

Writes OUT/scaling.json and OUT/scaling.md (with the exact command). With --device cpu (no CUDA) it
is a dry run of the plumbing: interpreter workers, `--gpu i` still passed so the placement is
exercised; its figures are labelled so and are no claim about GPUs. Exit codes: 0 written; 1 a run did
not finish (its workers' last lines are printed); 2 bad input (a store that already exists, more GPUs
than the host has).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; appended, so an installed kb comes first
    sys.path.append(str(ROOT))

from kernelbrain.store import mask, open_store  # noqa: E402
from kernelbrain.store.urls import is_url  # noqa: E402

from kernelbrain.core.protocol import BenchRequest  # noqa: E402
from kernelbrain.core.state import RunState  # noqa: E402
from kernelbrain.runtime.role import Task  # noqa: E402
from kernelbrain.runtime.roles import BenchmarkerRole  # noqa: E402
from tools.scaling_figures import (  # noqa: E402
    NoiseResult,
    NoiseShape,
    Sampled,
    ScalingResult,
    Worker,
    analyse,
    with_efficiency,
)

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "scaling"
# the roles placed once per GPU; the generator goes on GPU 0 and the scheduler needs none
PER_GPU = ("gatekeeper", "benchmarker", "profiler")
TARGETS = "efficiency >= 90% at 2 GPUs, >= 80% at 4; busy >= 85% on every GPU (issue 20)"


class BadInput(Exception):
    """The user's input cannot be measured as given; the message says what to fix."""


def db_for(template: str, n: int) -> str:
    """The store for N: `{n}` in the template replaced; a SQLite path without it gets `-nN` before its
    suffix; a URL without it is shared (each N a fresh run in it)."""
    if "{n}" in template:
        return template.replace("{n}", str(n))
    if is_url(template):
        return template
    p = Path(template)
    return str(p.with_name(f"{p.stem}-n{n}{p.suffix or '.db'}"))


def kb_env(db: str) -> dict[str, str]:
    """The children's environment: a URL travels in KB_DB (never on a command line, where it is public)."""
    env = dict(os.environ)
    if is_url(db):
        env["KB_DB"] = db
    return env


def db_args(db: str) -> list[str]:
    return [] if is_url(db) else ["--db", db]


def visible_gpus() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))


def placement(n: int) -> list[tuple[str, int | None]]:
    """(role, gpu) of every worker for N GPUs."""
    out: list[tuple[str, int | None]] = [("generator", 0), ("scheduler", None)]
    return out + [(role, i) for i in range(n) for role in PER_GPU]


class SmiSampler:
    """nvidia-smi's utilization.gpu per GPU every 500 ms, while the run lasts (CUDA only)."""

    def __init__(self, logdir: Path) -> None:
        self.path = logdir / "smi.csv"
        query = ["--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits", "-lms", "500"]
        with open(self.path, "w") as f:
            self.proc = subprocess.Popen(["nvidia-smi", *query], stdout=f, stderr=subprocess.DEVNULL)

    def stop(self) -> dict[int, float]:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        seen: dict[int, list[float]] = defaultdict(list)
        for line in self.path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                index, util = (int(x) for x in line.split(","))
                seen[index].append(util / 100)
        return {i: statistics.fmean(u) for i, u in seen.items()}


def run_kb(n: int, db: str, args: argparse.Namespace, logdir: Path) -> tuple[str, int, list[Worker], dict]:
    """`kb run --external-workers` and its workers for N GPUs, until the run finishes: its run id, exit
    code, workers and (CUDA) nvidia-smi's mean utilisation per GPU."""
    env = kb_env(db)
    cmd = [sys.executable, "-m", "kernelbrain", "run", str(args.problem), *db_args(db), *run_options(args)]
    with open(logdir / "run.log", "w") as log:  # the child has its own copy of the descriptor
        watcher = subprocess.Popen(
            [*cmd, "--external-workers", "--quiet"],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            start_new_session=True,
        )
    assert watcher.stdout is not None
    first = watcher.stdout.readline().split()
    if first[:1] != ["run"]:
        watcher.wait()
        raise RuntimeError(f"kb run printed {first!r}: {tail(logdir / 'run.log')}")
    run_id = first[1]
    sampler = SmiSampler(logdir) if args.device == "cuda" and shutil.which("nvidia-smi") else None
    procs: list[tuple[Worker, subprocess.Popen]] = []
    try:
        for role, gpu in placement(n):
            wcmd = [sys.executable, "-m", "kernelbrain", "worker", role, *db_args(db), "--run", run_id]
            wcmd += [] if gpu is None else ["--gpu", str(gpu)]
            with open(logdir / f"{role}-gpu{gpu}.log", "w") as log:
                p = subprocess.Popen(
                    wcmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
                )
            procs.append((Worker(role=role, gpu=gpu, pid=p.pid), p))
        try:
            watcher.communicate(timeout=args.timeout_s)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"N={n}: run {run_id} did not finish within {args.timeout_s:g} s") from e
        for _, p in procs:  # with --run, each worker exits once the run has finished
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=60)
    finally:
        stop(watcher, *(p for _, p in procs))
        util = sampler.stop() if sampler else {}
    return run_id, watcher.returncode, [w for w, _ in procs], util


def stop(*procs: subprocess.Popen) -> None:
    """SIGTERM what is still running (a worker finishes its task in flight), SIGKILL its group after."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def tail(path: Path, lines: int = 5) -> str:
    return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) if path.exists() else ""


def run_options(args: argparse.Namespace) -> list[str]:
    """The search's options, the same for every N."""
    opts = ["--device", args.device, "--seed", str(args.seed), "--max-candidates", str(args.max_candidates)]
    opts += ["--ladder", args.ladder] if args.ladder else []
    opts += ["--budget-gpu-s", str(args.budget_gpu_s)] if args.budget_gpu_s else []
    return opts


# --- timing noise ------------------------------------------------------------------------------------


class Loader(threading.Thread):
    """A benchmarker's rung looped on another GPU while `on` is set: what a busy neighbour does. `idle` is
    set while it is between calls with `on` clear."""

    def __init__(self, role: BenchmarkerRole, device: str, request: BenchRequest, timeout_s: float) -> None:
        super().__init__(daemon=True)
        self.role, self.device, self.request, self.timeout_s = role, device, request, timeout_s
        self.on, self.idle, self.done = threading.Event(), threading.Event(), threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        try:
            while not self.done.is_set():
                if not self.on.wait(0.05):
                    self.idle.set()
                    continue
                self.idle.clear()
                asked = self.role.consult(
                    self.device, self.request, timeout_s=self.timeout_s, task="noise/load"
                )
                if asked.fault is not None:
                    self.error = asked.line
                    return
        finally:
            self.done.set()
            self.idle.set()


def set_load(loaders: list[Loader], busy: bool) -> None:
    """Every neighbour in a call of its own (busy), or all of them between calls (idle), before returning."""
    for ld in loaders:
        (ld.on.set if busy else ld.on.clear)()
    for ld in loaders:
        while (ld.idle.is_set() if busy else not ld.idle.is_set()) and not ld.done.is_set():
            time.sleep(0.01)


def sampled(samples: list[float], within: list[float]) -> Sampled:
    q = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) >= 2 else [samples[0]] * 3
    return Sampled(
        samples_s=samples,
        median_s=statistics.median(samples),
        iqr_s=q[2] - q[0],
        within_rel_iqr=statistics.median(within),
    )


def noise_shape(shape: str, times: dict[str, list[float]], within: dict[str, list[float]]) -> NoiseShape:
    idle = sampled(times["idle"], within["idle"])
    busy = sampled(times["busy"], within["busy"])
    shift = busy.median_s / idle.median_s - 1
    noise = max(
        idle.iqr_s / idle.median_s, busy.iqr_s / busy.median_s, idle.within_rel_iqr, busy.within_rel_iqr
    )
    return NoiseShape(shape=shape, idle=idle, busy=busy, shift=shift, noise=noise, moved=abs(shift) > noise)


def timing_noise(db: str, run_id: str, device: str, loaded: list[int], repeats: int) -> NoiseResult:
    """The run's winner at its winning rung on GPU 0, through the benchmarker's own request and sandbox,
    `repeats` samples each with the `loaded` GPUs idle and busy, alternating (drift lands on both)."""
    with open_store(db, create=False, readonly=True) as store:
        state = store.fold(RunState(run_id), run_id=run_id)
        fin = state.finished
        result = NoiseResult(
            run_id=run_id,
            candidate=fin.winner if fin and fin.winner else "",
            rung=fin.winner_rung if fin and fin.winner_rung is not None else -1,
            gpu=0,
            loaded_gpus=loaded,
            repeats=repeats,
        )
        if not result.candidate or result.rung < 0:
            return result.model_copy(update={"error": "the run has no winner to time"})
        role = BenchmarkerRole(store, gpu=0)
        task = Task(f"{run_id}/noise/{result.candidate}/{result.rung}", result.candidate, result.rung)
        request = role.request(task, state)
        timeout = state.config.bench_timeout_s
        loaders = [Loader(BenchmarkerRole(store, gpu=g), device, request, timeout) for g in loaded]
    times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    within: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    error = None
    try:
        for ld in loaders:
            ld.start()
        set_load(loaders, busy=True)  # the neighbours' first calls compile meanwhile
        warm = role.consult(device, request, timeout_s=timeout, task=task.key)
        error = warm.line or None
        for _ in range(repeats if error is None else 0):
            for cond in ("idle", "busy"):
                set_load(loaders, busy=cond == "busy")
                asked = role.consult(device, request, timeout_s=timeout, task=task.key)
                if asked.fault is not None:
                    error = asked.line
                    break
                for s in asked.reply.shapes:
                    times[s.shape][cond].append(s.cand_median_s)
                    within[s.shape][cond].append(s.cand_iqr_s / s.cand_median_s)
            if error is not None:
                break
        error = error or next((f"a neighbour's rung failed: {ld.error}" for ld in loaders if ld.error), None)
    finally:
        for ld in loaders:
            ld.done.set()
        for ld in loaders:
            ld.join(timeout=timeout)
            ld.role.close()
        role.close()
    if error is not None:
        return result.model_copy(update={"error": error})
    return result.model_copy(update={"shapes": [noise_shape(k, times[k], within[k]) for k in times]})


# --- writing -----------------------------------------------------------------------------------------


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g} s"


def markdown(r: ScalingResult) -> str:
    head = (
        "DRY RUN on CPU (interpreter workers): plumbing only, no claim about GPUs" if r.dry_run else r.label
    )
    lines = [
        f"# Scaling over GPUs: {Path(r.problem).name}",
        "",
        f"**{head}.** Host {r.host}, device {r.device}, seed {r.seed}, --max-candidates {r.max_candidates}, "
        f"ladder {r.ladder or 'default'}. Same winner at every N: {'yes' if r.same_winner else 'NO'}; "
        f"same candidate stream: {'yes' if r.same_stream else 'NO'}. Targets: {r.targets}.",
        "",
        "```sh",
        r.command,
        "```",
        "",
        "| N | wall to winner | gated/min | rungs/min | efficiency gate / rungs | busy per GPU (bench) "
        "| decision latency p50 | bench claim latency / overhead p50 | rung backlog | compile | replay |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in r.runs:
        busy = ", ".join(f"{g.gpu}: {pct(g.busy_share)} ({pct(g.bench_busy_share)})" for g in run.gpus)
        claim = run.claim_latency.get("benchmarker")
        over = run.claim_overhead.get("benchmarker")
        lines.append(
            f"| {run.n} | {secs(run.wall_s)} | {run.gate_per_min:.3g} | {run.rungs_per_min:.3g} | "
            f"{pct(run.efficiency_gate)} / {pct(run.efficiency_rungs)} | {busy} | "
            f"{secs(run.decision_latency.median_s)} | {secs(claim.median_s if claim else None)} / "
            f"{secs(over.median_s if over else None)} | "
            f"{pct(run.bench_backlog_share)} | {secs(run.compile_s)} | "
            f"{'agrees' if run.replay_agrees else 'DIVERGES'} |"
        )
    if r.noise is not None:
        n = r.noise
        lines += [
            "",
            f"Timing noise: candidate {n.candidate} at rung {n.rung} on GPU {n.gpu}, GPUs {n.loaded_gpus} "
            f"idle vs busy, {n.repeats} alternating samples each.",
        ]
        if n.error:
            lines.append(f"Not measured: {n.error}.")
        else:
            lines += [
                "",
                "| shape | idle median | busy median | shift | noise | moved past noise |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for s in n.shapes:
                lines.append(
                    f"| {s.shape} | {s.idle.median_s:.4g} s | {s.busy.median_s:.4g} s | "
                    f"{100 * s.shift:+.1f}% | {100 * s.noise:.1f}% | {'YES' if s.moved else 'no'} |"
                )
    lines += [
        "",
        "Figures are defined in docs/multi-gpu.md#measuring-scaling; scaling.json has every number.",
    ]
    return "\n".join(lines) + "\n"


def parse_gpus(text: str) -> list[int]:
    try:
        gpus = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as e:
        raise BadInput(f"--gpus {text!r}: write GPU counts as a comma list, e.g. 1,2,4") from e
    if not gpus or gpus[0] < 1:
        raise BadInput(f"--gpus {text!r}: every count must be at least 1")
    return gpus


def main(argv: list[str] | None = None) -> int:
    from kernelbrain.runtime.runner import detect_device

    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("problem", type=Path)
    ap.add_argument("--gpus", default="1,2,4", help="the GPU counts to run, a comma list")
    ap.add_argument(
        "--device", choices=["cpu", "cuda"], default=None, help="default: cuda where there is a GPU"
    )
    ap.add_argument("--db", default=None, help="SQLite path template ({n}: the count) or postgresql:// URL")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-candidates", type=int, default=12)
    ap.add_argument("--ladder", default=None, help="as kb run's --ladder (default: kb's for the device)")
    ap.add_argument("--budget-gpu-s", type=float, default=None)
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    ap.add_argument(
        "--timing-noise", action="store_true", help="also time the winner on GPU 0, others idle/busy"
    )
    ap.add_argument("--noise-repeats", type=int, default=5)
    args = ap.parse_args(argv)
    args.device = args.device or detect_device()
    # CUDA numbers GPUs fastest first by default, nvidia-smi by PCI bus: so `--gpu i` and nvidia-smi's
    # index i are one GPU (every child inherits it: CUDA_* passes into the sandbox)
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        gpus = parse_gpus(args.gpus)
        if not args.problem.is_file():
            raise BadInput(f"no problem file at {args.problem}")
        if args.device == "cuda" and (have := visible_gpus()) < gpus[-1]:
            raise BadInput(f"--gpus asks for {gpus[-1]} GPUs and nvidia-smi shows {have} here")
        template = args.db or str(args.out / "scaling-n{n}.db")
        dbs = {n: db_for(template, n) for n in gpus}
        taken = [db for db in dbs.values() if not is_url(db) and Path(db).exists()]
        if taken:
            raise BadInput(f"{taken[0]} exists: each N needs a fresh store; remove it or pass another --db")
    except BadInput as e:
        print(f"scaling_bench: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="kb-scaling-"))
    runs = []
    for n in gpus:
        logdir = logs / f"n{n}"
        logdir.mkdir()
        if not is_url(dbs[n]):
            Path(dbs[n]).parent.mkdir(parents=True, exist_ok=True)
        print(f"N={n}: {mask(dbs[n])}", flush=True)
        try:
            run_id, code, workers, util = run_kb(n, dbs[n], args, logdir)
            if code not in (0, 3):  # 3: finished with no kernel; anything else left the run unfinished
                raise RuntimeError(f"N={n}: kb run exited {code}; run {run_id} is unfinished")
        except RuntimeError as e:
            print(f"scaling_bench: {e}", file=sys.stderr)
            for f in sorted(logdir.glob("*.log")):
                print(f"  {f.name}: {tail(f)}", file=sys.stderr)
            return 1
        runs.append(analyse(dbs[n], run_id, n, code, workers, util))
        r = runs[-1]
        print(
            f"N={n}: run {run_id} exit {code}: {r.gated} gated, {r.rungs} rungs in {r.wall_s:.1f} s",
            flush=True,
        )
    shutil.rmtree(logs)  # the workers' logs matter only when a run fails (their tails are printed then)
    runs = with_efficiency(runs)
    noise = None
    if args.timing_noise:
        base = runs[0]
        noise = timing_noise(
            dbs[base.n], base.run_id, args.device, list(range(1, gpus[-1])), args.noise_repeats
        )
    dry = args.device != "cuda"
    result = ScalingResult(
        dry_run=dry,
        label="dry run: CPU interpreter workers, plumbing only" if dry else "measured on CUDA GPUs",
        device=args.device,
        problem=str(args.problem),
        seed=args.seed,
        max_candidates=args.max_candidates,
        ladder=args.ladder,
        command=shlex.join(["python", "tools/scaling_bench.py", *[mask(a) for a in (argv or sys.argv[1:])]]),
        host=os.uname().nodename,
        targets=TARGETS,
        runs=runs,
        same_winner=len({r.winner for r in runs}) == 1,
        same_stream=len({tuple(r.candidates) for r in runs}) == 1,
        noise=noise,
    )
    (args.out / "scaling.json").write_bytes(orjson.dumps(result.model_dump(), option=orjson.OPT_INDENT_2))
    (args.out / "scaling.md").write_text(markdown(result))
    print(f"wrote {args.out / 'scaling.json'} and scaling.md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
