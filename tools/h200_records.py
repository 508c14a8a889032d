"""What the phases of issue 5's measurement (tools/h200_measure.py) share: the seed problems, the
ablation's arms (each arm's databases sit in a folder of its name), the JSON files they write and read,
and a recorded run opened read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]

PROBLEMS = ("softmax", "rmsnorm", "matvec", "linear_relu_div", "sdp_attn", "group_conv")
# the ablation's arms: kb's default ladder (no --ladder); flat: one rung, every shape at the top
# rung's fidelity (the default ladder ends so); ladder_primary: rung 0 on the primary shape with few
# repeats instead of the smallest shape (which is launch-bound for some problems)
LADDERS = {"ladder": None, "flat": "all:100:10", "ladder_primary": "primary:5:2,primary:30:5,all:100:10"}


def dump(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def run_of(db: Path):
    """The database's store, opened read-only, and its last run's state. Close the store after use."""
    from kernelbrain.store import open_store

    from kernelbrain.runtime.runner import load_state

    store = open_store(str(db), readonly=True)  # results are committed: reading must not touch them
    run_ids = store.run_ids()
    if not run_ids:
        raise SystemExit(f"{db} holds no run")
    return store, load_state(store, run_ids[-1])
