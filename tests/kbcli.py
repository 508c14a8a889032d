"""Run the real `kb` command (as `python -m kernelbrain`) in child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "tests" / "problems" / "softmax_small.py"


def kb_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("KB_POLL", "0.05")
    env.update(extra)
    return env


def kb(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelbrain", *args],
        capture_output=True,
        text=True,
        env=env or kb_env(),
        timeout=timeout,
    )


def kb_start(args: Sequence[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start `kb run ...` in its own process group; return it with the run id it printed first."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelbrain", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or kb_env(),
        start_new_session=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().split()
    assert first[:1] == ["run"], (
        f"kb run printed {first!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
    )
    return proc, first[1]
