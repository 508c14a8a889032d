"""`kb run`, `kb resume`, `kb worker` and `kb check`: the commands that start or serve a run's work."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from kernelbrain.commands.options import (
    allow_torch,
    db_option,
    echo_json,
    env_seconds,
    eval_option,
    json_option,
    open_store,
    resolve_device,
    strict_option,
    user_errors,
)
from kernelbrain.core import torch_ops
from kernelbrain.core.errors import RunError
from kernelbrain.core.events import RunConfig
from kernelbrain.runtime import isolation, reconnect, run_lease
from kernelbrain.runtime.batch import batch_runs
from kernelbrain.runtime.environment import without_secrets
from kernelbrain.runtime.roles import CREWS, ROLES
from kernelbrain.runtime.run_lease import RunLease
from kernelbrain.runtime.runner import (
    DEFAULT_RUNGS,
    WORKER_STORE_EXIT,
    load_state,
    parse_ladder,
    prepare_resume,
    require_run,
    start_run,
    supervise,
    supervise_runs,
)
from kernelbrain.runtime.worker import Crew, Worker
from kernelbrain.store import StoreError
from kernelbrain.views import lines


def drive(
    db: str,
    run_id: str,
    gpu: int | None,
    inprocess: bool,
    quiet: bool,
    as_json: bool,
    lease: RunLease,
    external: bool = False,
    after: int = 0,
) -> None:
    """Supervise the run, showing it live (kernelbrain.views.progress), then say how it ended; a database
    that fails under the run ends it with one line and EXIT_STORE."""
    from kernelbrain.views import ending, progress

    level = isolation.chosen()
    if level != "bwrap":  # one line: candidates are untrusted code, and this is how far they are held
        click.echo(
            f"kb: warning: candidates run with sandbox isolation {isolation.describe(level)}; "
            "install bubblewrap (bwrap) for full isolation",
            err=True,
        )

    reader = open_store(db)
    try:
        with progress.make_view(reader, run_id, after=after, as_json=as_json, quiet=quiet) as view:
            finished = supervise(
                db, run_id, gpu=gpu, inprocess=inprocess, external=external, progress=view, lease=lease
            )
        state = load_state(reader, run_id)
    except StoreError as e:
        sys.exit(ending.store_failed(run_id, e))
    finally:
        reader.close()
    code = ending.report(run_id, state, finished, as_json)
    if code:
        sys.exit(code)


def start_batch(
    db: str,
    paths: list[Path],
    config: RunConfig,
    gpu: int | None,
    inprocess: bool,
    external: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """One run a readable problem file, all of one new batch, driven by one pool; a file refused before
    its run could start gets its row (and EXIT_PROBLEM), the others run."""
    from kernelbrain.core.problem import ProblemError
    from kernelbrain.runtime.batch import new_batch_id
    from kernelbrain.views import batch as batch_view

    batch = new_batch_id()
    config = config.model_copy(update={"batch": batch})
    refused: list[batch_view.Row] = []
    run_ids: list[str] = []
    with open_store(db, create=True) as store:
        for path in paths:
            try:  # start_run reads the file and checks it first
                run_ids.append(start_run(store, str(path), config))
            except ProblemError as e:
                refused.append(batch_view.refused(str(path), str(e).splitlines()[0]))
    if as_json:  # the batch first, as a run's JSON starts with its RunStarted: a reader has its ids
        from kernelbrain.views import progress

        said = {
            "kind": "batch",
            "batch": batch,
            "runs": run_ids,
            "refused": [r.model_dump() for r in refused],
        }
        lines.echo(progress.json_line(said))
    else:
        lines.echo(f"batch {batch}: {len(run_ids)} runs, {len(refused)} files refused")
        for row in refused:
            lines.echo(f"{row.problem}: {row.outcome}")
    if not run_ids:
        lines.flush()
        sys.exit(batch_view.exit_code(refused))
    with run_lease.held(db, run_ids, "run") as lease:
        drive_batch(db, batch, run_ids, refused, gpu, inprocess, external, quiet, as_json, lease)


def drive_batch(
    db: str,
    batch: str,
    run_ids: list[str],
    refused: list[Any],
    gpu: int | None,
    inprocess: bool,
    external: bool,
    quiet: bool,
    as_json: bool,
    lease: RunLease,
    earlier: list[str] | None = None,
) -> None:
    """Supervise the batch's runs through one pool, a line as each ends, then the table and its code."""
    import time

    from kernelbrain.views import batch as batch_view
    from kernelbrain.views import ending, progress

    since = time.time()
    earlier = earlier or []  # the batch's runs that had finished before this session: in its table
    view = batch_view.BatchView(len(run_ids) + len(earlier))
    view.said.update(earlier)  # counted as ended: [k/N] goes on
    lines.flush()
    reader = open_store(db)
    try:
        ended = supervise_runs(
            db,
            run_ids,
            batch=batch,
            gpu=gpu,
            inprocess=inprocess,
            external=external,
            progress=None if as_json or quiet else view,
            lease=lease,
        )
        states = {rid: load_state(reader, rid) for rid in [*earlier, *run_ids]}
        ended |= {rid: states[rid].finished for rid in earlier}
        share = batch_view.timed_share(reader, run_ids, since, time.time())
    except StoreError as e:
        sys.exit(ending.store_failed(batch, e))
    finally:
        reader.close()
    rows = [batch_view.row(states[rid], ended[rid]) for rid in [*earlier, *run_ids]] + refused
    if as_json:
        for rid in run_ids:
            lines.result(progress.json_line(progress.result(states[rid], ended[rid]).model_dump(mode="json")))
    else:
        for text in batch_view.table(rows):
            lines.echo(text)
        lines.echo(share)
    code = batch_view.exit_code(rows)
    if code == ending.EXIT_INTERRUPTED:
        click.echo(
            f"kb: batch {batch} interrupted; everything recorded is kept. Continue with: kb resume {batch}",
            err=True,
        )
    elif code == ending.EXIT_WAITING:
        lines.result(f"kb: batch {batch} has runs waiting on parked tasks; once fixed: kb resume {batch}")
    if code:
        sys.exit(code)


@click.command()
@click.argument("problems", nargs=-1, required=True, type=click.Path())
@db_option
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--generator", default="expert", show_default=True)
@click.option("--max-candidates", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--budget-gpu-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop after this many device seconds.",
)
@click.option(
    "--budget-wall-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop after this much wall time.",
)
@click.option(
    "--budget-tokens", type=click.IntRange(min=1), default=None, help="Stop after this many LLM tokens."
)
@click.option(
    "--max-profiles",
    type=click.IntRange(min=1),
    default=None,
    help="Profile at most N finalists, the best first (default: every one).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--eta",
    type=click.IntRange(min=2),
    default=3,
    show_default=True,
    help="Successive halving keeps the top 1/eta of each rung.",
)
@click.option("--llm-base-url", default=None, help="OpenAI-compatible endpoint (env KB_LLM_BASE_URL).")
@click.option(
    "--llm-model", default=None, help="Model name (env KB_LLM_MODEL); the key comes from KB_LLM_API_KEY."
)
@click.option(
    "--llm-temperature",
    type=click.FloatRange(min=0),
    default=None,
    help="env KB_LLM_TEMPERATURE, default 0.8",
)
@click.option("--llm-max-tokens", type=click.IntRange(min=1), default=None, help="env KB_LLM_MAX_TOKENS")
@click.option(
    "--llm-timeout-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="per request (env KB_LLM_TIMEOUT_S)",
)
@click.option("--llm-concurrency", type=click.IntRange(min=1), default=None, help="env KB_LLM_CONCURRENCY")
@click.option(
    "--ladder",
    default=None,
    help="Rungs as SHAPES:REPEATS[:WARMUP],... (default on GPU: smallest:10:3,primary:30:5,all:100:10).",
)
@click.option(
    "--allow-torch",
    default="",
    callback=allow_torch,
    metavar="CLASSES",
    help="Let candidates keep these torch ops (comma list) and fuse the rest, labelled so: "
    f"{torch_ops.help_text()}. Default: none, all Triton.",
)
@eval_option
@strict_option
@click.option("--gpu", type=click.IntRange(min=0), default=None, help="GPU index for the workers.")
@click.option("--inprocess", is_flag=True, help="Step the workers in this process (tests, debugging).")
@click.option(
    "--external-workers",
    is_flag=True,
    help="Start no workers: `kb worker ROLE --db FILE` processes (one benchmarker per GPU) drive the run.",
)
@click.option("--quiet", is_flag=True, help="Print only the run id and the result.")
@json_option
@user_errors
def run(
    problems: tuple[str, ...],
    db: str,
    device: str,
    generator: str,
    max_candidates: int,
    budget_gpu_s: float | None,
    budget_wall_s: float | None,
    budget_tokens: int | None,
    max_profiles: int | None,
    seed: int,
    eta: int,
    llm_base_url: str | None,
    llm_model: str | None,
    llm_temperature: float | None,
    llm_max_tokens: int | None,
    llm_timeout_s: float | None,
    llm_concurrency: int | None,
    ladder: str | None,
    allow_torch: tuple[str, ...],
    eval_mode: bool,
    strict_fp32: bool,
    gpu: int | None,
    inprocess: bool,
    external_workers: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Search for a faster kernel for each PROBLEM (a KernelBench .py file, or a folder of them).

    Several problems make a batch: one run each, in one database, served by one pool of workers (timed
    work alone on the device, the rest spread over the cores); `kb resume BATCH` resumes its unfinished
    runs."""
    from kernelbrain import generators
    from kernelbrain.core.problem import read_problem
    from kernelbrain.runtime.batch import problem_paths

    if inprocess and external_workers:
        raise click.UsageError("--inprocess and --external-workers exclude each other; pass one")
    paths = problem_paths(problems)
    if not paths:
        raise click.UsageError(f"no problem files (*.py) in {', '.join(problems)}")
    batched = len(paths) > 1 or Path(problems[0]).is_dir()
    if not batched:
        read_problem(paths[0])  # a bad problem file is reported before the database is opened
    dev = resolve_device(device)
    config = RunConfig(
        generator=generator,
        device=dev,
        seed=seed,
        max_candidates=max_candidates,
        budget_gpu_s=budget_gpu_s,
        budget_wall_s=budget_wall_s,
        budget_tokens=budget_tokens,
        max_profiles=max_profiles,
        eta=eta,
        rungs=parse_ladder(ladder) if ladder else DEFAULT_RUNGS[dev],
        llm_base_url=llm_base_url,
        llm_model=llm_model,
        llm_temperature=llm_temperature,
        llm_max_tokens=llm_max_tokens,
        llm_timeout_s=llm_timeout_s,
        llm_concurrency=llm_concurrency,
        analysis_timeout_s=env_seconds("KB_ANALYSIS_TIMEOUT_S", 60.0),
        allow_torch=allow_torch,
        eval_mode=eval_mode,
        strict_fp32=strict_fp32,
    )
    if generator == "llm" and not (llm_model or os.environ.get("KB_LLM_MODEL")):
        raise click.UsageError("--generator llm needs a model: pass --llm-model or set KB_LLM_MODEL")
    generators.get(generator, **config.generator_options())  # a misconfigured generator fails here
    if batched:
        start_batch(db, paths, config, gpu, inprocess, external_workers, quiet, as_json)
        return
    with open_store(db, create=True) as store:
        run_id = start_run(store, str(paths[0]), config)
    with run_lease.held(db, run_id, "run") as lease:  # held before anyone is told the run's id
        if not as_json:  # JSON readers find the id on every line, RunStarted first
            lines.echo(f"run {run_id}")
        lines.flush()
        drive(db, run_id, gpu, inprocess, quiet, as_json, lease, external_workers)


@click.command()
@click.argument("problem", type=click.Path(dir_okay=False))
@click.argument("candidate", type=click.Path(dir_okay=False))
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--bench", is_flag=True, help="Also time it against the reference on every rung of the ladder.")
@click.option(
    "--allow-torch",
    default="",
    callback=allow_torch,
    metavar="CLASSES",
    help="Let it keep these classes of torch ops (comma list; as kb run's). Default: none, all Triton.",
)
@eval_option
@strict_option
@json_option
@user_errors
def check(
    problem: str,
    candidate: str,
    device: str,
    bench: bool,
    allow_torch: tuple[str, ...],
    eval_mode: bool,
    strict_fp32: bool,
    as_json: bool,
) -> None:
    """Gate one candidate file (ModelNew) against PROBLEM, outside any run; exit 1 when it fails.

    The file must be written in kb's candidate subset, checked on the host before any child starts (else
    it fails `policy`, naming the line and what to write instead): imports of torch, torch.nn,
    torch.nn.functional, triton, triton.language, math and kernelbrain.candidate; at module level
    constants, @triton.jit kernels, plain helpers and class ModelNew(nn.Module); host code of arithmetic,
    tensor metadata, allocation, views, copies and casts, kernel launches with integer grids, and the
    torch ops --allow-torch names; kernel bodies of tl.*, arithmetic and control flow. No dunders,
    getattr/setattr, eval/exec, lambdas, try/with/del/global, os, sys, numpy, ctypes, threads,
    torch.ops or torch.library, .item(). docs/architecture.md ("The candidate subset") says why.
    """
    from kernelbrain.runtime.check import check as do_check
    from kernelbrain.views.describe import fmt_s

    dev = resolve_device(device)
    rungs = DEFAULT_RUNGS[dev] if bench else None
    result = do_check(
        problem, candidate, dev, rungs, torch_ops=allow_torch, eval_mode=eval_mode, strict_fp32=strict_fp32
    )
    if as_json:
        echo_json(result.model_dump())
    elif result.passed:
        click.echo(
            f"PASSED on {result.seeds} seeds: max abs err {result.max_abs_err:.3g}, max rel err "
            f"{result.max_rel_err:.3g} (tolerance {result.tolerance:g})"
        )
        for r in result.rungs:
            for s in r.shapes:
                click.echo(
                    f"  rung {r.rung} {s.shape}: {fmt_s(s.cand_median_s)} (IQR {fmt_s(s.cand_iqr_s)}) vs "
                    f"reference {fmt_s(s.ref_median_s)}: {s.speedup:.3g}x [{r.timer}]"
                )
    else:
        click.echo(f"FAILED [{result.category}]: {result.detail}")
    if not result.passed:
        sys.exit(1)


def resume_batch(batch: str, db: str, gpu: int | None, inprocess: bool, quiet: bool, as_json: bool) -> None:
    """Resume every unfinished run of the batch through one pool."""
    from kernelbrain.runtime.batch import batch_runs
    from kernelbrain.views import batch as batch_view

    with open_store(db) as store:
        run_ids = batch_runs(store, batch)
        if not run_ids:
            raise RunError(f"no batch {batch!r} in {store.path}; `kb ls` lists the runs there")
        todo = [rid for rid in run_ids if load_state(store, rid).finished is None]
    if not todo:
        with open_store(db) as store:
            rows = [batch_view.row(s, s.finished) for s in (load_state(store, rid) for rid in run_ids)]
        for text in batch_view.table(rows):
            lines.echo(text)
        lines.result(f"batch {batch} finished already: {len(run_ids)} runs. Nothing to resume")
        return
    with run_lease.held(db, todo, "resume") as lease:
        with open_store(db) as store:
            for rid in todo:
                prepare_resume(store, rid)
        if not as_json:
            lines.echo(f"batch {batch} resumed: {len(todo)} of {len(run_ids)} runs unfinished")
        done = [rid for rid in run_ids if rid not in todo]
        drive_batch(db, batch, todo, [], gpu, inprocess, False, quiet, as_json, lease, done)


@click.command()
@click.argument("run_id")
@db_option
@click.option("--gpu", type=click.IntRange(min=0), default=None, help="GPU index for the workers.")
@click.option("--inprocess", is_flag=True, help="Step the workers in this process (tests, debugging).")
@click.option("--quiet", is_flag=True, help="Print only the resume line and the result.")
@json_option
@user_errors
def resume(run_id: str, db: str, gpu: int | None, inprocess: bool, quiet: bool, as_json: bool) -> None:
    """Continue an interrupted run, or every unfinished run of a batch, from its log (a finished one:
    say so, exit 0)."""
    from kernelbrain.runtime.batch import is_batch_id
    from kernelbrain.views import ending

    if is_batch_id(run_id):
        resume_batch(run_id, db, gpu, inprocess, quiet, as_json)
        return
    with open_store(db) as store:
        state = load_state(store, run_id)
    if state.finished is not None:  # nothing to drive: no lease needed
        ending.already_finished(run_id, state, as_json)
        return
    with run_lease.held(db, run_id, "resume") as lease:  # a second live resume is refused here
        with open_store(db) as store:
            before = store.last_seq(run_id) or 0  # this session shows what it adds, from RunResumed on
            state = prepare_resume(store, run_id)  # (finished meanwhile, by the holder it waited for)
        if state.finished is not None:
            ending.already_finished(run_id, state, as_json)
            return
        if not as_json:
            lines.echo(
                f"run {run_id} resumed at event #{state.position}: {len(state.candidates)} candidates, "
                f"{len(state.live())} unfinished"
            )
        lines.flush()
        drive(db, run_id, gpu, inprocess, quiet, as_json, lease, after=before)


@click.command()
@click.argument("role", type=click.Choice([*ROLES, *CREWS]))
@db_option
@click.option("--run", "run_id", default=None, help="Serve only this run (default: every unfinished run).")
@click.option("--batch", default=None, help="Serve only the runs of this batch.")
@click.option("--gpu", type=click.IntRange(min=0), default=None, help="GPU index for this worker.")
@click.option(
    "--idle-exit-s",
    type=click.FloatRange(min=0),
    default=None,
    help="Exit after this long with nothing to do.",
)
# started by `kb run`, which says for the run when the database is lost: this worker says nothing of it,
# and exits WORKER_STORE_EXIT, quietly, on a database that fails it at work (kb run checks it, says why)
@click.option("--supervised", is_flag=True, hidden=True)
@user_errors
def worker(
    role: str,
    db: str,
    run_id: str | None,
    batch: str | None,
    gpu: int | None,
    idle_exit_s: float | None,
    supervised: bool,
) -> None:
    """Run one worker process (kb run starts them for you).

    ROLE is one role, `candidates` (the gatekeeper, benchmarker and profiler in turn, sharing their
    sandbox children) or `all` (every role so, the generator started without the LLM's key). kb run
    starts one process a role on a GPU; on a CPU `all`, or for an LLM run the generator, `candidates`
    and the scheduler."""
    if role != "generator" and without_secrets(dict(os.environ)) != dict(os.environ):
        # started by hand with the keys in its environment, which its children could read in /proc:
        # start again without them (only the generator talks to the LLM)
        argv = [sys.executable, "-m", "kernelbrain", *sys.argv[1:]]
        os.execve(sys.executable, argv, without_secrets(dict(os.environ)))
    reconnect.speak_as(f"{role} worker", quiet=supervised)
    if run_id is not None:
        with open_store(db) as store:
            require_run(store, run_id)  # a worker for a run that is not there would idle forever
    # (one that cannot start says why, supervised or not)
    if batch is not None:
        with open_store(db) as store:
            if not batch_runs(store, batch):
                raise RunError(f"no batch {batch!r} in {store.path}; `kb ls` lists the runs there")
    if role in CREWS:
        w: Crew | Worker = Crew(db, CREWS[role], run_id, batch=batch, gpu=gpu)
    else:
        w = Worker(db, role, run_id, batch=batch, gpu=gpu)
    w.install_signal_handlers()
    try:
        w.run(idle_exit_s=idle_exit_s)
    except StoreError:
        if supervised:
            sys.exit(WORKER_STORE_EXIT)
        raise
