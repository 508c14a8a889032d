"""The one place that picks the SQLite driver, plus helpers about its errors.

pysqlite3 bundles SQLite 3.53.x, which fixes the WAL-reset race that can corrupt a database written
by several connections (SQLite 3.7.0-3.51.2); the stdlib module is the fallback where it is absent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

if TYPE_CHECKING:  # pysqlite3 ships no types; its dbapi2 is the stdlib module's API
    import sqlite3
else:
    try:
        from pysqlite3 import dbapi2 as sqlite3
    except ImportError:  # pragma: no cover - exercised only where the wheel is missing
        import sqlite3

__all__ = ["is_busy", "retry_busy", "sqlite3"]

T = TypeVar("T")


def is_busy(exc: BaseException) -> bool:
    """True for SQLITE_BUSY / SQLITE_LOCKED, i.e. another connection holds the lock we need."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return True
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def retry_busy(fn: Callable[[], T], attempts: int = 5) -> T:
    """Run fn; if SQLite still reports busy/locked after its own busy_timeout, run it again.

    busy_timeout plus BEGIN IMMEDIATE is the first line of defence. A few paths return SQLITE_BUSY
    without calling the busy handler (WAL recovery, journal-mode changes), so fn (a whole
    transaction, safe to repeat) is retried with jittered backoff. The fast path costs one try.
    """
    try:
        return fn()
    except sqlite3.OperationalError as e:
        if not is_busy(e):
            raise
    for attempt in Retrying(
        retry=retry_if_exception(is_busy),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.05, max=2.0),
        reraise=True,
    ):
        with attempt:
            return fn()
    raise AssertionError("unreachable: Retrying re-raises the last error")  # pragma: no cover
