"""What some tests need from the machine beyond kb's Python packages, and whether it is here:

- `postgresql`: a PostgreSQL server's binaries (initdb, pg_ctl), which tests/pg_server.py starts a
  throw-away server with (the store's tests: every test that takes the `pg_url` or `pg_server` fixture);
- `chromium`: headless Chromium, which draws the report's plots (tests/test_report.py);
- `bwrap`: bubblewrap that works here, the sandbox the cache and red-team tests are about (the tests
  marked `needs("bwrap")`).

tests/conftest.py skips a test whose piece is missing, with one line naming it and how to get it, and
fails it instead under CI (CI=true), so CI cannot pass by skipping. `python -m tests.needs` prints the
Debian packages of the missing pieces that a package would bring (./test.sh installs them).
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    name: str  # as in `needs("bwrap")`
    what: str  # what it is, in words
    package: str  # the Debian package that brings it


PIECES = {
    p.name: p
    for p in (
        Piece("postgresql", "a PostgreSQL server (initdb, pg_ctl)", "postgresql"),
        Piece("chromium", "headless Chromium", "chromium"),
        Piece("bwrap", "bubblewrap (bwrap)", "bubblewrap"),
    )
}


def _postgresql() -> tuple[str | None, bool]:
    from tests.pg_server import PgServerError, bin_dir

    try:
        folder = bin_dir()
    except PgServerError:
        return "no initdb on PATH or in /usr/lib/postgresql/*/bin, and KB_PG_BIN unset", True
    lacking = [b for b in ("initdb", "pg_ctl", "postgres") if not (folder / b).exists()]
    return (f"{folder} has no {', '.join(lacking)}", True) if lacking else (None, False)


def _chromium() -> tuple[str | None, bool]:
    return (None, False) if shutil.which("chromium") else ("no chromium on PATH", True)


def _bwrap() -> tuple[str | None, bool]:
    from kernelbrain.runtime import isolation

    binary = isolation.bwrap_binary()
    if binary is None:
        return "no bwrap on PATH and KB_BWRAP unset", True
    if not isolation.usable("bwrap"):
        return f"{binary} cannot create its namespaces on this machine", False
    return None, False


@functools.cache
def why_missing(name: str) -> tuple[str | None, bool]:
    """(why the piece is not usable here, or None; whether installing its package would bring it)."""
    return {"postgresql": _postgresql, "chromium": _chromium, "bwrap": _bwrap}[name]()


def reason(name: str) -> str | None:
    """The one line a test that needs the piece is skipped with; None where the piece is here."""
    why, installable = why_missing(name)
    if why is None:
        return None
    piece = PIECES[name]
    fix = f"apt-get install {piece.package} (./test.sh does, as root)" if installable else "see `kb doctor`"
    return f"{piece.what} is missing ({why}): {fix}"


def is_missing(skip_reason: str, name: str | None = None) -> bool:
    """Whether a skip's reason (pytest's "Skipped: ..." included) is reason()'s, for this piece or any."""
    text = skip_reason.removeprefix("Skipped: ")
    return any(text.startswith(f"{p.what} is missing") for p in PIECES.values() if name in (None, p.name))


def in_ci() -> bool:
    """CI=true (any value but empty, 0 or false): a missing piece fails its tests instead."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def installable() -> list[str]:
    """The Debian packages that would bring the missing pieces."""
    return [
        p.package for p in PIECES.values() if why_missing(p.name)[0] is not None and why_missing(p.name)[1]
    ]


if __name__ == "__main__":
    print(" ".join(installable()))
