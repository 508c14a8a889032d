"""Where a database's GPU time went: the spans each task held its device alone (BudgetCharged's
`alone_from`/`alone_to`), summed by kind of task (rung, ncu, roofline, duel), against the wall time of the
log; whether any two overlapped; what the tasks of each kind waited on their device (for memory, for the
lock: BudgetCharged's `room_wait_s`, `lock_wait_s`) against their wall time; each run's winner and end;
and the tasks of unfinished runs claimed and never done by the log's end (what a stalled or cut-off pool
was doing: a sweep's `sweep_snapshot.db`).

    python3 tools/timed_spans.py RUN.db [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path


def kind(action: str) -> str:
    """A task's kind from its key (RUN/bench/CAND/RUNG, RUN/profile/CAND/ncu, ...)."""
    parts = action.split("/")
    return {"bench": "rung", "adjudicate": "duel"}.get(parts[1], parts[1]) + (
        "/ncu" if parts[-1] == "ncu" else ""
    )


def spans(db: Path) -> dict:
    from kernelbrain.store import open_store

    from kernelbrain.core.events import decode
    from kernelbrain.views.batch import alone_spans

    with open_store(str(db), create=False, readonly=True) as store:
        events = store.read()
    alone = sorted(s for device in alone_spans(events).values() for s in device)
    by_kind: dict[str, float] = collections.defaultdict(float)
    for a, b, action in alone:
        by_kind[kind(action)] += b - a
    ends = {raw.run_id: decode(raw) for raw in events if raw.type == "RunFinished"}
    wall = events[-1].ts - events[0].ts if events else 0.0
    held = sum(b - a for a, b, _ in alone)
    return {
        "wall_s": wall,
        "alone_s": held,
        "alone_share": held / wall if wall else 0.0,
        "by_kind_s": dict(by_kind),
        "overlaps": sum(alone[i + 1][0] < alone[i][1] for i in range(len(alone) - 1)),
        "waits": waits(events),
        "runs": {run: {"winner": e.winner, "reason": e.reason} for run, e in ends.items()},
        "open": open_tasks(events),
    }


def waits(events: list) -> dict[str, dict[str, float]]:
    """Per kind of task: how many were charged, their wall seconds, the seconds they held the device's
    lock (a gate's only while its work was on the device), and the seconds they waited for the
    device's memory and for its lock (summed)."""
    out: dict[str, dict[str, float]] = {}
    for e in events:
        if e.type != "BudgetCharged":
            continue
        zero = {"tasks": 0, "wall_s": 0.0, "room_s": 0.0, "lock_s": 0.0, "held_s": 0.0}
        row = out.setdefault(kind(e.payload["action"]), zero)
        row["tasks"] += 1
        row["wall_s"] += e.payload.get("wall_s", 0.0)
        row["room_s"] += e.payload.get("room_wait_s", 0.0)
        row["lock_s"] += e.payload.get("lock_wait_s", 0.0)
        row["held_s"] += e.payload.get("lock_held_s", 0.0)  # 0 in a log before BudgetCharged v4
    return out


def open_tasks(events: list) -> list[tuple[str, str, float]]:
    """The tasks of runs not finished that were claimed and neither charged (BudgetCharged, a task's last
    event), faulted nor parked after their last claim: (task, worker, seconds from that claim to the
    log's end), oldest first."""
    claimed: dict[str, tuple[str, float]] = {}
    finished = set()
    for e in events:
        if e.type == "TaskClaimed":
            claimed[e.payload["task"]] = (e.payload["worker"], e.ts)
        elif e.type == "BudgetCharged":
            claimed.pop(e.payload["action"], None)
        elif e.type in ("TaskFaulted", "TaskParked"):
            claimed.pop(e.payload["task"], None)
        elif e.type == "RunFinished":
            finished.add(e.run_id)
    end = events[-1].ts if events else 0.0
    rows = [(t, w, end - ts) for t, (w, ts) in claimed.items() if t.split("/")[0] not in finished]
    return sorted(rows, key=lambda row: -row[2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = spans(args.db)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(
        f"log {out['wall_s']:.1f} s, held alone {out['alone_s']:.1f} s ({100 * out['alone_share']:.0f}%), "
        f"overlapping spans {out['overlaps']}"
    )
    print("  " + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(out["by_kind_s"].items())))
    for k, w in sorted(out["waits"].items()):
        print(
            f"  {k}: {w['tasks']:.0f} tasks, {w['wall_s']:.0f} s of wall, waited {w['room_s']:.0f} s for "
            f"memory and {w['lock_s']:.0f} s for the lock, held it {w['held_s']:.0f} s"
        )
    for run, end in out["runs"].items():
        print(f"  {run}: {end['winner'] or 'no winner'} ({(end['reason'] or '')[:80]})")
    print(f"claimed and not done at the log's end: {len(out['open'])}")
    for task, worker, age in out["open"][:20]:
        print(f"  {task} by {worker}, claimed {age:.0f} s before the end")


if __name__ == "__main__":
    main()
