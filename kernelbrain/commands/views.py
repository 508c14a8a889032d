"""The commands that read: `kb ls`, `status`, `events`, `replay`, `audit`, `export`, `report`, and
`kb doctor` on the machine itself."""

from __future__ import annotations

import sys
import time

import click

from kernelbrain.commands.options import (
    db_option,
    echo_json,
    json_option,
    read_store,
    run_view,
    user_errors,
)
from kernelbrain.runtime.runner import load_state, require_run
from kernelbrain.store import mask


@click.command()
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
        echo_json(report.model_dump())
    else:
        click.echo(doc.render(report))
    if report.failed:
        sys.exit(1)


@click.command("ls")
@db_option
@json_option
@user_errors
def ls(db: str, as_json: bool) -> None:
    """List the runs in the database."""
    from kernelbrain.views.describe import listing, listing_rows

    with read_store(db) as store:
        rows = listing_rows(store)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(f"no runs in {mask(db)}")
        return
    for line in listing(rows):
        click.echo(line)


@click.command()
@run_view
def status(run_id: str, db: str, as_json: bool) -> None:
    """Where a run stands: candidates per state, the leader, budget spent. Of a batch (RUN_ID a batch
    id): a row per run and the device's timed share of the batch's wall time so far."""
    from kernelbrain.runtime.batch import is_batch_id
    from kernelbrain.views.describe import status_dict

    if is_batch_id(run_id):
        from kernelbrain.views.batch import batch_status

        with read_store(db) as store:
            b = batch_status(store, run_id)
        if as_json:
            echo_json(b)
            return
        click.echo(f"batch {run_id}: {b['ended']} of {len(b['runs'])} runs ended; {b['share']}")
        for text in b["table"]:
            click.echo(f"  {text}")
        return
    with read_store(db) as store:
        d = status_dict(load_state(store, run_id))
    if as_json:
        echo_json(d)
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
        f"  spent: {b['device_s']:.1f} device s (budget {b['budget_gpu_s'] or '-'}; children busy "
        f"{b['gpu_s']:.1f} s), {b['tokens']} tokens, "
        f"{b['wall_s']:.1f} wall s; {d['events']} events, {d['resumes']} resumes"
    )


@click.command()
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


@click.command()
@run_view
def replay(run_id: str, db: str, as_json: bool) -> None:
    """Recompute every scheduler decision from the log; exit 1 on any divergence."""
    from kernelbrain.views.replay import replay as do_replay

    with read_store(db) as store:
        require_run(store, run_id)  # not load_state: a damaged log is what replay reports, not an error
        report = do_replay(store, run_id)
    if as_json:
        echo_json(report.model_dump())
    else:
        for line in report.divergences:
            click.echo(f"DIVERGENCE {line}")
        verdict = "DIVERGE from" if report.divergences else "agree with"
        if report.stopped is not None:  # a newer kb's event: what follows it is not this kb's to check
            click.echo(
                f"replay stopped: {report.stopped}; the {report.decisions} decisions before it {verdict} "
                f"policy v{report.policy_version}"
            )
        else:
            click.echo(
                f"replayed {report.events} events, {report.candidates} candidates: {report.decisions} "
                f"decisions {verdict} policy v{report.policy_version}"
            )
    if not report.agrees:
        sys.exit(1)


@click.command()
@click.argument("run_id")
@db_option
@click.option("--candidate", default=None, help="Audit this candidate instead of the winner.")
@user_errors
def audit(run_id: str, db: str, candidate: str | None) -> None:
    """Explain why the winner won: lineage, gate, ladder numbers, promotions, runners-up."""
    from kernelbrain.views.audit import audit as do_audit

    with read_store(db) as store:
        click.echo(do_audit(load_state(store, run_id), candidate))


@click.command()
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


@click.command()
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
