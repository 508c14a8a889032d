"""Riding out a lost database: a call that fails with StoreUnavailable (the server down or restarting,
the network cut) is made again with jittered exponential backoff, for up to KB_DB_RETRY_S seconds, after
which the error stands. Any other error (a refused login, a stale lease) is raised at once.

Only calls that are safe to repeat go through here: reads, and appends whose idempotency keys and fence
make a repeat harmless (a write whose commit was lost with the connection is found, or refused by its
fence, when it is made again)."""

from __future__ import annotations

import logging
import os
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

log = logging.getLogger("kernelbrain.reconnect")
T = TypeVar("T")

RETRY_S = float(os.environ.get("KB_DB_RETRY_S", "600"))
FIRST_WAIT_S = 0.2
LONGEST_WAIT_S = 10.0


def _said(what: str) -> Callable[[RetryCallState], None]:
    def before_sleep(rs: RetryCallState) -> None:
        error = rs.outcome.exception() if rs.outcome is not None else None
        wait = rs.next_action.sleep if rs.next_action is not None else 0.0
        log.warning("%s: the database is unavailable (%s); trying again in %.1f s", what, error, wait)

    return before_sleep


def retrying(fn: Callable[[], T], what: str, *, give_up_s: float | None = None) -> T:
    """fn(), made again while it raises StoreUnavailable, for up to give_up_s (KB_DB_RETRY_S) seconds."""
    for attempt in Retrying(
        retry=retry_if_exception_type(StoreUnavailable),
        wait=wait_exponential_jitter(multiplier=FIRST_WAIT_S, max=LONGEST_WAIT_S),
        stop=stop_after_delay(RETRY_S if give_up_s is None else give_up_s),
        before_sleep=_said(what),
        reraise=True,
    ):
        with attempt:
            return fn()
    raise AssertionError("unreachable: Retrying re-raises the last error")  # pragma: no cover
