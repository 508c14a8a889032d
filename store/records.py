"""Plain records that cross the store's API. No behaviour; the domain gives payloads meaning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. `key` is its idempotency key: appending an existing key is a no-op."""

    run_id: str
    type: str
    version: int
    key: str
    payload: dict[str, Any]
    actor: str
    subject: str | None = None
    stage: int | None = None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as recorded: `seq` is its global position (1, 2, ...), `ts` the append wall time."""

    seq: int
    run_id: str
    type: str
    version: int
    key: str
    payload: dict[str, Any]
    actor: str
    subject: str | None
    stage: int | None
    ts: float


@dataclass(frozen=True, slots=True)
class Lease:
    """A claim on `task` by `owner` until `deadline` (epoch seconds); `token` fences stale holders."""

    task: str
    owner: str
    token: int
    deadline: float
