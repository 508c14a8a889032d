"""`kb db`: the commands on stores themselves; `kb db copy` moves a run between them."""

from __future__ import annotations

import click

from kernelbrain.commands.options import echo_json, json_option, open_store, read_store, user_errors
from kernelbrain.store import mask


@click.group()
def db() -> None:
    """Work on the stores themselves: copy a run between SQLite files and PostgreSQL databases."""


@db.command()
@click.argument("src")
@click.argument("dst")
@click.argument("run_id")
@json_option
@user_errors
def copy(src: str, dst: str, run_id: str, as_json: bool) -> None:
    """Copy RUN_ID from the store SRC to DST (each a SQLite file or postgresql:// URL), with its blobs
    and leases; verify it at DST by replay. Refused when DST holds other events of that run."""
    from kernelbrain.views.transfer import copy_run

    with read_store(src) as source, open_store(dst, create=True) as dest:
        report = copy_run(source, dest, run_id)
    if as_json:
        echo_json(
            {
                "run_id": run_id,
                "copied": report.copied,
                "already": report.already,
                "blobs": report.blobs,
                "leases": report.leases,
                "replay": report.replay.model_dump(),
            }
        )
        return
    click.echo(
        f"copied run {run_id} from {mask(src)} to {mask(dst)}: {report.copied} events"
        f" ({report.already} already there), {report.blobs} blobs, {report.leases} leases; same state, "
        f"replay of {report.replay.events} events agrees ({report.replay.decisions} decisions)"
    )
