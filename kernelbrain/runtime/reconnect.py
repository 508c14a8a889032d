"""Riding out a lost database: a call that fails with StoreUnavailable (the server down or restarting,
the network cut) is made again with jittered exponential backoff, for up to KB_DB_RETRY_S seconds, after
which the error stands. Any other error (a refused login, a stale lease) is raised at once.

Only calls that are safe to repeat go through here: reads, and appends whose idempotency keys and fence
make a repeat harmless (a write whose commit was lost with the connection is found, or refused by its
fence, when it is made again).

An outage is said once a process, on stderr: "the database is unavailable (...); trying again" when it
begins, and "the database is back after N s" when a call gets through again (OUTAGE). The connection
pool's own warnings, one a reconnection attempt (psycopg_pool, a few a second), are folded into that
line rather than printed. A worker that `kb run` started says nothing of it: its supervisor says it for
the run (`quiet`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from kernelbrain.store import StoreUnavailable

T = TypeVar("T")

RETRY_S = float(os.environ.get("KB_DB_RETRY_S", "600"))
FIRST_WAIT_S = 0.2
LONGEST_WAIT_S = 10.0
POOL_LOGGER = "psycopg.pool"  # psycopg_pool logs a warning at each failed (re)connection attempt
POOL_OUTAGE = ("error connecting", "reconnection attempt", "task run")
# a connection the server dropped, which the pool replaces: a lost database says so in the reconnection
# attempts that follow (a lone drop, an idle connection the server closed, is no outage)
POOL_DROPPED = ("discarding broken connection", "discarding closed connection")


class Outage:
    """Whether this process has lost its database, said once when it is lost and once when it is back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.since: float | None = None  # monotonic time of the first failure, while it lasts
        self.who = ""  # who says it: `kb worker`'s role; none for `kb run`, which speaks for the run
        self.quiet = False

    def began(self, error: object) -> None:
        with self.lock:
            if self.since is not None:
                return
            self.since = time.monotonic()
        line = (str(error).strip().splitlines() or ["no reason given"])[0]
        self._say(f"the database is unavailable ({line}); trying again")

    def ended(self) -> None:
        if self.since is None:  # (the common case, unlocked: a call that got through with nothing lost)
            return
        with self.lock:
            if self.since is None:
                return
            took, self.since = time.monotonic() - self.since, None
        self._say(f"the database is back after {took:.1f} s")

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(f"kb: {self.who + ': ' if self.who else ''}{text}", file=sys.stderr, flush=True)


OUTAGE = Outage()


class _PoolOutage(logging.Filter):
    """The pool's reconnection warnings become OUTAGE's one line, the connections it drops go unsaid;
    its other records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if any(s in text for s in POOL_DROPPED):
            return False
        if record.levelno >= logging.WARNING and any(s in text for s in POOL_OUTAGE):
            args = record.args if isinstance(record.args, tuple) else ()
            OUTAGE.began(args[-1] if args and isinstance(args[-1], Exception) else text)  # the error
            return False
        return True


logging.getLogger(POOL_LOGGER).addFilter(_PoolOutage())


def speak_as(who: str, *, quiet: bool = False) -> None:
    """Name this process in its outage lines (`kb worker`'s role), or leave them to its supervisor."""
    OUTAGE.who, OUTAGE.quiet = who, quiet


def _said(rs: RetryCallState) -> None:
    OUTAGE.began(rs.outcome.exception() if rs.outcome is not None else "no reason given")


def retrying(fn: Callable[[], T], what: str, *, give_up_s: float | None = None) -> T:
    """fn(), made again while it raises StoreUnavailable, for up to give_up_s (KB_DB_RETRY_S) seconds,
    after which the error stands, saying that `what` gave up."""
    limit = RETRY_S if give_up_s is None else give_up_s
    try:
        for attempt in Retrying(
            retry=retry_if_exception_type(StoreUnavailable),
            wait=wait_exponential_jitter(multiplier=FIRST_WAIT_S, max=LONGEST_WAIT_S),
            stop=stop_after_delay(limit),
            before_sleep=_said,
            reraise=True,
        ):
            with attempt:
                result = fn()
                OUTAGE.ended()
                return result
    except StoreUnavailable as e:
        if OUTAGE.since is None:  # it never got as far as a retry
            raise
        raise StoreUnavailable(f"{e}; {what} gave up after {limit:g} s (KB_DB_RETRY_S)") from e
    raise AssertionError("unreachable: Retrying re-raises the last error")  # pragma: no cover
