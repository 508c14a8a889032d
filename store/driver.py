"""The one place that picks the SQLite driver, plus helpers about its errors.

pysqlite3 bundles SQLite 3.53.x, which fixes the WAL-reset race that can corrupt a database written
by several connections (SQLite 3.7.0-3.51.2); the stdlib module is the fallback where it is absent.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
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

__all__ = ["is_busy", "no_checkpoint_on_close", "retry_busy", "sqlite3"]

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


_NO_CKPT_ON_CLOSE = 1006  # SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE (sqlite3.h)


def no_checkpoint_on_close(conn: sqlite3.Connection, path: str) -> bool:
    """Tell SQLite not to checkpoint the WAL when `conn` (open on `path`) closes; True when it took.

    The last connection to close checkpoints and writes the -shm file, which it maps. Where that file
    can no longer be written (an immutable file, a read-only mount), a write to a mapped page is a
    SIGBUS, which no Python code can catch. Neither sqlite3 module (before Python 3.12) exposes
    sqlite3_db_config, so it is called through ctypes on the connection's handle: the first field
    after the object header in both modules' Connection structs. The handle is used only once SQLite
    itself names `path` as its main file, so a layout this does not know is never written to."""
    module = sys.modules.get("pysqlite3._sqlite3" if sqlite3.__name__.startswith("pysqlite3") else "_sqlite3")
    if module is None or module.__file__ is None:
        return False
    with contextlib.suppress(OSError, AttributeError, ValueError):
        lib = ctypes.CDLL(module.__file__)
        lib.sqlite3_db_filename.restype = ctypes.c_char_p
        lib.sqlite3_db_filename.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.sqlite3_db_config.restype = ctypes.c_int
        lib.sqlite3_db_config.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        handle = ctypes.c_void_p.from_address(id(conn) + object.__basicsize__).value
        if not handle:
            return False
        name = lib.sqlite3_db_filename(handle, b"main")
        if not name or os.path.realpath(os.fsdecode(name)) != os.path.realpath(path):
            return False
        took = ctypes.c_int(0)
        ok = lib.sqlite3_db_config(handle, _NO_CKPT_ON_CLOSE, 1, ctypes.byref(took))
        return bool(ok == 0 and took.value == 1)
    return False
