"""The `kb` command: thin click commands over the library. User errors are one line and a non-zero exit.

The group lives here; its commands live in kernelbrain.commands, one module per concern."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from kernelbrain import __version__
from kernelbrain.commands import db as db_commands
from kernelbrain.commands import run as run_commands
from kernelbrain.commands import views


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


@click.group(cls=KbGroup)
@click.version_option(version=__version__, prog_name="kb")
def main() -> None:
    """KernelBrain: search for fast, correct Triton kernels that replace a PyTorch reference."""
    logging.basicConfig(level=logging.WARNING, format="kb %(name)s: %(message)s")


for _command in (
    run_commands.run,
    run_commands.check,
    views.doctor,
    run_commands.resume,
    run_commands.worker,
    views.ls,
    views.status,
    views.events,
    views.replay,
    views.audit,
    views.export,
    views.report,
    db_commands.db,
):
    main.add_command(_command)
