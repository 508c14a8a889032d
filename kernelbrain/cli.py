"""The `kb` command: thin click commands over the library. User errors are one line and a non-zero exit."""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import click
import orjson

from kernelbrain import __version__
from kernelbrain.core import torch_ops
from kernelbrain.core.events import EventError, RunConfig
from kernelbrain.core.problem import ProblemError
from kernelbrain.generators import GenerationError
from kernelbrain.runtime import isolation
from kernelbrain.runtime.check import CandidateFileError
from kernelbrain.runtime.environment import without_secrets
from kernelbrain.runtime.isolation import IsolationError
from kernelbrain.runtime.roles import ROLES
from kernelbrain.runtime.runner import (
    DEFAULT_RUNGS,
    RunError,
    detect_device,
    load_state,
    parse_ladder,
    prepare_resume,
    require_run,
    start_run,
    supervise,
)
from kernelbrain.runtime.worker import Worker
from kernelbrain.store import Store, StoreError, mask
from kernelbrain.store import open_store as open_db
from kernelbrain.views.ending import EXIT_PROBLEM

DEFAULT_DB = "kernelbrain.db"
USER_ERRORS = (
    StoreError,
    RunError,
    EventError,
    GenerationError,
    LookupError,
    IsolationError,
    CandidateFileError,
)


class ProblemUnusable(click.ClickException):
    """The problem file is at fault (unreadable, not Python, not KernelBench's format): its own exit code."""

    exit_code = EXIT_PROBLEM


def db_option(f: Callable) -> Callable:
    return click.option(
        "--db",
        envvar="KB_DB",
        default=DEFAULT_DB,
        show_default=True,
        help="SQLite file, or postgresql://user@host:port/dbname URL, holding the runs (env KB_DB).",
    )(f)


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")(f)


def user_errors(f: Callable) -> Callable:
    """Known failures become one clear line (click prints 'Error: ...') and exit 1, or EXIT_PROBLEM where
    the problem file is at fault."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except ProblemError as e:
            raise ProblemUnusable(str(e).splitlines()[0]) from e
        except USER_ERRORS as e:
            raise click.ClickException(str(e).splitlines()[0]) from e

    return wrapper


def open_store(db: str, *, create: bool = False) -> Store:
    return open_db(db, create=create)


def read_store(db: str) -> Store:
    """For commands that only read: recorded databases (benchmarks/results) keep their bytes."""
    return open_db(db, readonly=True)


def _env_seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not value > 0:
        raise click.UsageError(f"{name}={text!r} is not a number of seconds above 0; set it so or unset it")
    return value


def _allow_torch(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    try:
        return torch_ops.parse(value)
    except torch_ops.UnknownClass as e:
        raise click.BadParameter(str(e)) from None


def _echo_json(obj: Any) -> None:
    click.echo(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode())


class KbGroup(click.Group):
    """click prints a usage error as the usage, a hint and the error, over four lines; kb as one."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            # the help shown for a bare `kb` (click >= 8.2) stays as click shows it, after which click exits
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except getattr(click.exceptions, "NoArgsIsHelpError", ()) as e:
            e.show()
            sys.exit(e.exit_code)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx else "kb"
            click.echo(f"Error: {e.format_message()} (see `{where} --help`)", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        # non-standalone click returns the exit code of --help/--version/ctx.exit, else the command's None
        sys.exit(rv if type(rv) is int else 0)


def _device(device: str) -> str:
    """--device as the workers will use it; cuda on a machine without an NVIDIA GPU is refused here."""
    if device == "auto":
        return detect_device()
    if device == "cuda" and detect_device() != "cuda":
        raise click.BadParameter(
            "cuda, but this machine has no NVIDIA GPU (no /dev/nvidia*); use --device cpu or auto",
            param_hint="'--device'",
        )
    return device


@click.group(cls=KbGroup)
@click.version_option(version=__version__, prog_name="kb")
def main() -> None:
    """KernelBrain: search for fast, correct Triton kernels that replace a PyTorch reference."""
    logging.basicConfig(level=logging.WARNING, format="kb %(name)s: %(message)s")


def _drive(
    db: str,
    run_id: str,
    gpu: int | None,
    inprocess: bool,
    quiet: bool,
    as_json: bool,
    external: bool = False,
    after: int = 0,
) -> None:
    """Supervise the run, showing it live (kernelbrain.views.progress), then say how it ended."""
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
            finished = supervise(db, run_id, gpu=gpu, inprocess=inprocess, external=external, progress=view)
        state = load_state(reader, run_id)
    finally:
        reader.close()
    code = ending.report(run_id, state, finished, as_json)
    if code:
        sys.exit(code)


@main.command()
@click.argument("problem", type=click.Path(dir_okay=False))
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
    callback=_allow_torch,
    metavar="CLASSES",
    help="Let candidates keep these torch ops (comma list) and fuse the rest, labelled so: "
    f"{torch_ops.help_text()}. Default: none, all Triton.",
)
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
    problem: str,
    db: str,
    device: str,
    generator: str,
    max_candidates: int,
    budget_gpu_s: float | None,
    budget_wall_s: float | None,
    budget_tokens: int | None,
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
    gpu: int | None,
    inprocess: bool,
    external_workers: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Search for a faster kernel for PROBLEM (a KernelBench .py file)."""
    from kernelbrain import generators
    from kernelbrain.core.problem import read_problem

    if inprocess and external_workers:
        raise click.UsageError("--inprocess and --external-workers exclude each other; pass one")
    read_problem(problem)  # a bad problem file is reported before the database is opened
    dev = _device(device)
    config = RunConfig(
        generator=generator,
        device=dev,
        seed=seed,
        max_candidates=max_candidates,
        budget_gpu_s=budget_gpu_s,
        budget_wall_s=budget_wall_s,
        budget_tokens=budget_tokens,
        eta=eta,
        rungs=parse_ladder(ladder) if ladder else DEFAULT_RUNGS[dev],
        llm_base_url=llm_base_url,
        llm_model=llm_model,
        llm_temperature=llm_temperature,
        llm_max_tokens=llm_max_tokens,
        llm_timeout_s=llm_timeout_s,
        llm_concurrency=llm_concurrency,
        analysis_timeout_s=_env_seconds("KB_ANALYSIS_TIMEOUT_S", 60.0),
        allow_torch=allow_torch,
    )
    generators.get(generator, **config.generator_options())  # a misconfigured generator fails here
    with open_store(db, create=True) as store:
        run_id = start_run(store, problem, config)
    if not as_json:  # JSON readers find the id on every line, RunStarted first
        click.echo(f"run {run_id}")
    sys.stdout.flush()
    _drive(db, run_id, gpu, inprocess, quiet, as_json, external_workers)


@main.command()
@click.argument("problem", type=click.Path(dir_okay=False))
@click.argument("candidate", type=click.Path(dir_okay=False))
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--bench", is_flag=True, help="Also time it against the reference on every rung of the ladder.")
@click.option(
    "--allow-torch",
    default="",
    callback=_allow_torch,
    metavar="CLASSES",
    help="Let it keep these classes of torch ops (comma list; as kb run's). Default: none, all Triton.",
)
@json_option
@user_errors
def check(
    problem: str, candidate: str, device: str, bench: bool, allow_torch: tuple[str, ...], as_json: bool
) -> None:
    """Gate one candidate file (ModelNew) against PROBLEM, outside any run; exit 1 when it fails."""
    from kernelbrain.runtime.check import check as do_check
    from kernelbrain.views.describe import fmt_s

    dev = _device(device)
    result = do_check(problem, candidate, dev, DEFAULT_RUNGS[dev] if bench else None, torch_ops=allow_torch)
    if as_json:
        _echo_json(result.model_dump())
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


@main.command()
@click.option("--llm-base-url", default=None, help="Endpoint to probe (env KB_LLM_BASE_URL).")
@click.option("--llm-model", default=None, help="Model it should list (env KB_LLM_MODEL).")
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Per network probe.",
)
@click.option(
    "--db", envvar="KB_DB", help="Also check this store: SQLite file or postgresql:// URL (env KB_DB)."
)
@json_option
def doctor(
    llm_base_url: str | None, llm_model: str | None, timeout_s: float, db: str | None, as_json: bool
) -> None:
    """Check what this machine gives kb: GPU, torch, Triton, ncu, SQLite, the LLM endpoint (and --db's store).

    Every check is shown; the exit status is 1 when any check fails (a warning does not)."""
    from kernelbrain.views import doctor as doc

    report = doc.run(llm_base_url, llm_model, timeout_s, db=db)
    if as_json:
        _echo_json(report.model_dump())
    else:
        click.echo(doc.render(report))
    if report.failed:
        sys.exit(1)


@main.command()
@click.argument("run_id")
@db_option
@click.option("--gpu", type=click.IntRange(min=0), default=None, help="GPU index for the workers.")
@click.option("--inprocess", is_flag=True, help="Step the workers in this process (tests, debugging).")
@click.option("--quiet", is_flag=True, help="Print only the resume line and the result.")
@json_option
@user_errors
def resume(run_id: str, db: str, gpu: int | None, inprocess: bool, quiet: bool, as_json: bool) -> None:
    """Continue an interrupted run from its log."""
    with open_store(db) as store:
        before = store.last_seq(run_id) or 0  # this session shows what it adds, from RunResumed on
        state = prepare_resume(store, run_id)
    if not as_json:
        click.echo(
            f"run {run_id} resumed at event #{state.position}: {len(state.candidates)} candidates, "
            f"{len(state.live())} unfinished"
        )
    sys.stdout.flush()
    _drive(db, run_id, gpu, inprocess, quiet, as_json, after=before)


@main.command()
@click.argument("role", type=click.Choice(ROLES))
@db_option
@click.option("--run", "run_id", default=None, help="Serve only this run (default: every unfinished run).")
@click.option("--gpu", type=click.IntRange(min=0), default=None, help="GPU index for this worker.")
@click.option(
    "--idle-exit-s",
    type=click.FloatRange(min=0),
    default=None,
    help="Exit after this long with nothing to do.",
)
@user_errors
def worker(role: str, db: str, run_id: str | None, gpu: int | None, idle_exit_s: float | None) -> None:
    """Run one worker process (kb run starts all five for you)."""
    if role != "generator" and without_secrets(dict(os.environ)) != dict(os.environ):
        # started by hand with the keys in its environment, which its children could read in /proc:
        # start again without them (only the generator talks to the LLM)
        argv = [sys.executable, "-m", "kernelbrain", *sys.argv[1:]]
        os.execve(sys.executable, argv, without_secrets(dict(os.environ)))
    if run_id is not None:
        with open_store(db) as store:
            require_run(store, run_id)  # a worker for a run that is not there would idle forever
    w = Worker(db, role, run_id, gpu=gpu)
    w.install_signal_handlers()
    w.run(idle_exit_s=idle_exit_s)


@main.command("ls")
@db_option
@json_option
@user_errors
def ls(db: str, as_json: bool) -> None:
    """List the runs in the database."""
    from kernelbrain.views.describe import status_dict

    with read_store(db) as store:
        rows = [status_dict(load_state(store, rid)) for rid in store.run_ids()]
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        click.echo(f"no runs in {mask(db)}")
    for r in rows:
        best = f"{r['leader_score']:.4g}" if r["leader_score"] is not None else "-"
        click.echo(
            f"{r['run_id']}  {r['problem']:<20} {r['state']:<24} candidates {r['candidates']['proposed']:<3} "
            f"best score {best}  winner {r['winner'] or '-'}"
        )


@main.command()
@click.argument("run_id")
@db_option
@json_option
@user_errors
def status(run_id: str, db: str, as_json: bool) -> None:
    """Where a run stands: candidates per state, the leader, budget spent."""
    from kernelbrain.views.describe import status_dict

    with read_store(db) as store:
        d = status_dict(load_state(store, run_id))
    if as_json:
        _echo_json(d)
        return
    click.echo(f"run {d['run_id']} ({d['problem']}, {d['device']}, {d['generator']}): {d['state']}")
    if d["finish_reason"]:
        click.echo(f"  stopped: {d['finish_reason']}")
    c = d["candidates"]
    click.echo(
        f"  candidates: {c['proposed']} proposed, {c['gate_passed']} gated, {c['gate_failed']} rejected, "
        f"{c['pruned']} pruned, {c['finalists']} finalists; measured per rung {d['measured_at_rung']}"
    )
    if d["leader"]:
        speeds = ", ".join(f"{k} {v:.3g}x" for k, v in d["leader_speedups"].items())
        click.echo(f"  best: {d['leader']} score {d['leader_score']:.4g} ({speeds})")
    b = d["budget"]
    click.echo(
        f"  spent: {b['gpu_s']:.1f} device s (budget {b['budget_gpu_s'] or '-'}), {b['tokens']} tokens, "
        f"{b['wall_s']:.1f} wall s; {d['events']} events, {d['resumes']} resumes"
    )


@main.command()
@click.argument("run_id")
@db_option
@click.option("--follow", is_flag=True, help="Keep printing new events until the run finishes.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@click.option("--all", "show_all", is_flag=True, help="Include lease claims and budget charges.")
@user_errors
def events(run_id: str, db: str, follow: bool, as_json: bool, show_all: bool) -> None:
    """Print a run's events."""
    from kernelbrain.views.describe import QUIET_TYPES, event_line
    from kernelbrain.views.progress import event_dict, json_line

    with read_store(db) as store:
        state = load_state(store, run_id)
        after = 0
        while True:
            for raw in store.read(after=after, run_id=run_id):
                after = raw.seq
                if as_json:
                    click.echo(json_line(event_dict(raw)))
                elif show_all or raw.type not in QUIET_TYPES:
                    click.echo(event_line(raw))
            store.fold(state, run_id=run_id)
            if not follow or state.finished is not None:
                return
            time.sleep(0.5)


@main.command()
@click.argument("run_id")
@db_option
@json_option
@user_errors
def replay(run_id: str, db: str, as_json: bool) -> None:
    """Recompute every scheduler decision from the log; exit 1 on any divergence."""
    from kernelbrain.views.replay import replay as do_replay

    with read_store(db) as store:
        require_run(store, run_id)  # not load_state: a damaged log is what replay reports, not an error
        report = do_replay(store, run_id)
    if as_json:
        _echo_json(report.model_dump())
    else:
        for line in report.divergences:
            click.echo(f"DIVERGENCE {line}")
        click.echo(
            f"replayed {report.events} events, {report.candidates} candidates: {report.decisions} decisions "
            f"{'agree with' if report.agrees else 'DIVERGE from'} policy v{report.policy_version}"
        )
    if not report.agrees:
        sys.exit(1)


@main.command()
@click.argument("run_id")
@db_option
@click.option("--candidate", default=None, help="Audit this candidate instead of the winner.")
@user_errors
def audit(run_id: str, db: str, candidate: str | None) -> None:
    """Explain why the winner won: lineage, gate, ladder numbers, promotions, runners-up."""
    from kernelbrain.views.audit import audit as do_audit

    with read_store(db) as store:
        click.echo(do_audit(load_state(store, run_id), candidate))


@main.command()
@click.argument("run_id")
@db_option
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="File to write.")
@click.option("--candidate", default=None, help="Export this candidate instead of the winner.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["standalone", "kernelbench"]),
    default="standalone",
    show_default=True,
    help="standalone: ModelNew, the reference and a check-and-time harness (`python kernel.py`); "
    "kernelbench: ModelNew and its imports only, the file KernelBench's evaluator takes.",
)
@user_errors
def export(run_id: str, db: str, output: str, candidate: str | None, fmt: str) -> None:
    """Write the winner as a standalone module defining ModelNew."""
    from kernelbrain.views.export import export as do_export
    from kernelbrain.views.export import kernelbench_flags

    with read_store(db) as store:
        path = do_export(store, load_state(store, run_id), output, candidate, fmt)  # type: ignore[arg-type]
    click.echo(f"wrote {path}")
    flags = kernelbench_flags(path.read_text(encoding="utf-8")) if fmt == "kernelbench" else []
    if flags:
        click.echo(
            f"kb: note: KernelBench's static checker (kernel_static_checker.py) would reject {path} for "
            f"{', '.join(flags)}; it reads docstrings too",
            err=True,
        )


@main.command()
@click.argument("run_id")
@db_option
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="HTML file to write.")
@user_errors
def report(run_id: str, db: str, output: str) -> None:
    """Write one self-contained HTML page on a run: speedup over device time, lineage, funnel, failures,
    the winner's roofline and its diff against its parent."""
    from kernelbrain.views.report import write_report

    with read_store(db) as store:
        path = write_report(store, run_id, output)
    click.echo(f"wrote {path}")
