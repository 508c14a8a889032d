"""A batch: the runs one `kb run A.py B.py ...` (or a folder) started together, one a problem, served
by one pool of workers. Each run stays a run of its own (resumable, replayable, auditable alone); the
batch is only their common `config.batch` id, so `kb resume BATCH` finds them again."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from kernelbrain.store import Store


def new_batch_id() -> str:
    return time.strftime("b%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def is_batch_id(text: str) -> bool:
    return text.startswith("b") and text[1:9].isdigit()


def batch_runs(store: Store, batch: str) -> list[str]:
    """The runs of the batch, in the order they were started."""
    return [
        raw.run_id
        for raw in store.read(types=["RunStarted"])
        if (raw.payload.get("config") or {}).get("batch") == batch
    ]


def problem_paths(arguments: tuple[str, ...]) -> list[Path]:
    """The problem files the arguments name: files as given, a folder's `*.py` files (not below it) in
    KernelBench's numeric order (`2_X.py` before `10_Y.py`); each file once."""

    def number(p: Path) -> tuple[int, str]:
        head = p.name.split("_", 1)[0]
        return (int(head) if head.isdigit() else 10**9, p.name)

    out: list[Path] = []
    for arg in arguments:
        path = Path(arg)
        found = sorted(path.glob("*.py"), key=number) if path.is_dir() else [path]
        out += [p for p in found if p.resolve() not in {q.resolve() for q in out}]
    return out
