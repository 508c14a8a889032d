"""Every `kb` command explains itself: `kb CMD --help` exits 0 with the command's own help text, and the
README shows `kb --help` as it is."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import kernelbrain
from kernelbrain.cli import main

ROOT = Path(__file__).resolve().parents[1]


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand below group, as argument paths ('run',), ('some', 'sub'), ..."""
    ctx = click.Context(group)
    paths = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        paths.append((*prefix, name))
        if isinstance(cmd, click.Group):
            paths += command_paths(cmd, (*prefix, name))
    return paths


def resolve(path: tuple[str, ...]) -> click.Command:
    cmd: click.Command = main
    for name in path:
        assert isinstance(cmd, click.Group)
        sub = cmd.get_command(click.Context(cmd), name)
        assert sub is not None
        cmd = sub
    return cmd


def flat(text: str) -> str:
    """Whitespace-normalised: click re-wraps help text to the terminal width."""
    return " ".join(text.split())


PATHS = command_paths(main)
EXPECTED = {"run", "resume", "worker", "ls", "status", "events", "replay", "audit", "export"}


def kb(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KB_DB"}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "kernelbrain", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_list_is_the_documented_one() -> None:
    assert {p[0] for p in PATHS} >= EXPECTED


def test_the_group_has_help() -> None:
    res = CliRunner().invoke(main, ["--help"], prog_name="kb")
    assert res.exit_code == 0, res.output
    assert main.help and main.help.strip()
    assert flat(main.help.split("\n\n")[0]) in flat(res.output)
    for name in EXPECTED:
        assert name in res.output


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    cmd = resolve(path)
    text = (cmd.help or cmd.short_help or "").strip()
    assert text, f"kb {' '.join(path)} has no help text"
    res = CliRunner().invoke(main, [*path, "--help"], prog_name="kb")
    assert res.exit_code == 0, res.output
    assert f"Usage: kb {' '.join(path)}" in res.output
    assert flat(text.split("\n\n")[0]) in flat(res.output)
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.opts[-1] in res.output


def test_python_m_kernelbrain_help() -> None:
    res = kb("--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: kb ")
    for name in EXPECTED:
        assert f"  {name} " in res.stdout
    assert res.stderr == ""


def test_the_readme_shows_kb_help_as_it_is() -> None:
    """README.md's `$ kb --help` sample is the real output, at click's widest wrap (80 columns)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sample = re.search(r"^\$ kb --help\n(.*?)^```", readme, re.M | re.S)
    assert sample, "README.md shows no `$ kb --help` block"
    res = kb("--help", COLUMNS="80")
    assert res.returncode == 0, res.stderr
    assert sample[1] == res.stdout, "README.md's kb --help sample is stale: paste `COLUMNS=80 kb --help`"


def test_an_unknown_command_is_a_usage_error() -> None:
    res = kb("no-such-command")
    assert res.returncode == 2
    assert "no-such-command" in res.stderr and "Traceback" not in res.stderr


def _installed() -> bool:
    try:
        importlib.metadata.version("kernelbrain")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_version() -> None:
    res = kb("--version")
    assert res.returncode == 0, res.stderr
    assert kernelbrain.__version__ in res.stdout
