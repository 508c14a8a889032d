"""What every `kb` command shares: the --db and --json options, user errors as one line, the store
opened from --db, and the option parsers more than one command uses."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, Literal, ParamSpec, TypeVar

import click
import orjson

from kernelbrain.core import torch_ops
from kernelbrain.core.errors import UserError
from kernelbrain.core.events import EventError
from kernelbrain.core.problem import ProblemError
from kernelbrain.generators import GenerationError
from kernelbrain.runtime import limits, scratch
from kernelbrain.runtime.check import CandidateFileError
from kernelbrain.runtime.isolation import IsolationError
from kernelbrain.runtime.run_lease import RunHeld
from kernelbrain.runtime.runner import detect_device
from kernelbrain.store import Store, StoreError
from kernelbrain.store import open_store as open_db
from kernelbrain.views.ending import EXIT_BUSY, EXIT_PROBLEM

P = ParamSpec("P")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_DB = "kernelbrain.db"
# kb's own types for a user's mistake: a builtin LookupError or KeyError is a bug, and keeps its traceback
USER_ERRORS = (
    UserError,  # RunError among them
    StoreError,
    EventError,
    GenerationError,
    IsolationError,
    CandidateFileError,
)


class ProblemUnusable(click.ClickException):
    """The problem file is at fault (unreadable, not Python, not KernelBench's format): its own exit code."""

    exit_code = EXIT_PROBLEM


class RunBusy(click.ClickException):
    """Another live process drives the run (it holds the run's lease): its own exit code."""

    exit_code = EXIT_BUSY


def db_option(f: F) -> F:
    return click.option(
        "--db",
        envvar="KB_DB",
        default=DEFAULT_DB,
        show_default=True,
        help="SQLite file, or postgresql://user@host:port/dbname URL, holding the runs (env KB_DB).",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")(f)


def eval_option(f: F) -> F:
    return click.option(
        "--eval",
        "eval_mode",
        is_flag=True,
        help="Build the reference and the candidates in eval mode (default: as Model(*get_init_inputs()) "
        "leaves them, training for a KernelBench file: batch norms by batch statistics, dropout refused).",
    )(f)


def strict_option(f: F) -> F:
    return click.option(
        "--strict-fp32",
        "strict_fp32",
        is_flag=True,
        help="Hold float32 convolutions and matmuls to IEEE float32 accuracy even where the reference runs "
        "them in TF32 (by default candidates are as accurate as the reference as it runs here).",
    )(f)


def user_errors(f: Callable[P, T]) -> Callable[P, T]:
    """Known failures become one clear line (click prints 'Error: ...') and exit 1, or EXIT_PROBLEM where
    the problem file is at fault, EXIT_BUSY where another process drives the run. First, the scratch
    folders and sandbox cgroups that killed kb processes left on this machine are swept
    (runtime/scratch.py, runtime/limits.py)."""

    @functools.wraps(f)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        scratch.sweep()
        limits.sweep_cgroups()
        try:
            return f(*args, **kwargs)
        except ProblemError as e:
            raise ProblemUnusable(str(e).splitlines()[0]) from e
        except RunHeld as e:
            raise RunBusy(str(e).splitlines()[0]) from e
        except USER_ERRORS as e:
            raise click.ClickException(str(e).splitlines()[0]) from e

    return wrapper


def run_view(f: Callable[P, T]) -> Callable[P, T]:
    """A view of one run: its RUN_ID argument, --db, --json, and user errors as one line."""
    return click.argument("run_id")(db_option(json_option(user_errors(f))))


def open_store(db: str, *, create: bool = False) -> Store:
    return open_db(db, create=create)


def read_store(db: str) -> Store:
    """For commands that only read: recorded databases (benchmarks/results) keep their bytes."""
    return open_db(db, readonly=True)


def env_seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not value > 0:
        raise click.UsageError(f"{name}={text!r} is not a number of seconds above 0; set it so or unset it")
    return value


def allow_torch(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    """--allow-torch's callback: the comma list as torch_ops classes, an unknown one refused."""
    try:
        return torch_ops.parse(value)
    except torch_ops.UnknownClass as e:
        raise click.BadParameter(str(e)) from None


def echo_json(obj: Any) -> None:
    click.echo(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode())


def resolve_device(device: str) -> Literal["cpu", "cuda"]:
    """--device (auto, cpu or cuda) as the workers will use it; cuda on a machine without an NVIDIA GPU is
    refused here."""
    found: Literal["cpu", "cuda"] = "cuda" if detect_device() == "cuda" else "cpu"
    if device == "auto":
        return found
    if device == "cuda" and found != "cuda":
        raise click.BadParameter(
            "cuda, but this machine has no NVIDIA GPU (no /dev/nvidia*); use --device cpu or auto",
            param_hint="'--device'",
        )
    return "cuda" if device == "cuda" else "cpu"
