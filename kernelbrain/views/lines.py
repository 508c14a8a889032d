"""Lines on stdout that outlive their reader: `kb run ... | tee log` and a Ctrl-C, which stops tee at once
while kb still stops its workers and says how to resume.

Python ignores SIGPIPE, so a write to a pipe whose reader is gone raises BrokenPipeError. `echo` takes it
as the reader's leaving, not kb's failure: stdout is pointed at /dev/null for the rest of the process
(what is still buffered, too), and `gone()` says so, so that the lines that matter (how the run ended)
go to stderr instead.
"""

from __future__ import annotations

import contextlib
import os
import sys

import click

_gone = False


def gone() -> bool:
    """Whether stdout's reader has left."""
    return _gone


def _drop_stdout() -> None:
    global _gone
    _gone = True
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def echo(text: str, err: bool = False) -> None:
    """click.echo, where a stdout whose reader has left is /dev/null from then on."""
    if err:
        click.echo(text, err=True)
        return
    try:
        click.echo(text)
    except BrokenPipeError:
        _drop_stdout()


def flush() -> None:
    """Flush stdout, as `echo` writes it."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()


def result(text: str) -> None:
    """A line that must be read: on stdout, and on stderr too once stdout's reader has left."""
    echo(text)
    if _gone:
        click.echo(text, err=True)
