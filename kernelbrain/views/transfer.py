"""Moving a run between stores (`kb db copy`): its events, with their original times and actors, the
blobs they name, and its tasks' leases (their fencing tokens, and whether each task is done), so the
copy can be resumed or served by workers at the destination. Verified there: the copy's folded state is
the source's, and `kb replay` agrees with its log.

The copied events get the destination's seqs, in the same order; a RunCopied event after them lists
their seqs at the source (in a blob), through which replay reads the basis of each decision among them
(kernelbrain/views/replay.py). Events are never rewritten, so a copy of a copy, or a run that goes on at
the destination and is copied back, replays all the same.

A destination that already holds some of the run's events must hold the same ones, in the same order
(an earlier copy that stopped part way): the rest is copied after them, and the RunCopied once (its key
names the copy). Any other difference is refused before anything is written, as is a source that does
not replay. A copy that fails its verification stays written (a log is append-only); the message says
so."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from kernelbrain.core.errors import RunError
from kernelbrain.core.events import RunCopied
from kernelbrain.runtime.role import owner_id
from kernelbrain.runtime.runner import load_state, require_run
from kernelbrain.store import NewEvent, Store, StoredEvent
from kernelbrain.store.urls import is_url
from kernelbrain.views.describe import status_dict
from kernelbrain.views.replay import ReplayReport, replay

BATCH = 1000  # events per append at the destination
_HASH = re.compile(r"[0-9a-f]{64}")  # a blob's name (sha256), wherever a payload holds one


class CopyRefused(RunError):
    """The copy cannot be made, or does not verify; the message says why and what to do."""


@dataclass(frozen=True)
class CopyReport:
    run_id: str
    copied: int  # events appended at the destination
    already: int  # events it held before
    blobs: int
    leases: int
    replay: ReplayReport


def _same(a: StoredEvent, b: StoredEvent) -> bool:
    """The same event, whatever its position in either log."""
    fields = ("run_id", "type", "version", "key", "payload", "actor", "subject", "stage", "ts")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def blob_names(events: list[StoredEvent]) -> list[str]:
    """Every payload string shaped like a blob's name, in order of first appearance."""
    seen: dict[str, None] = {}
    for e in events:
        for s in _strings(e.payload):
            if _HASH.fullmatch(s):
                seen.setdefault(s)
    return list(seen)


def _copy_lease(src: Store, dst: Store, task: str, owner: str) -> bool:
    """Bring the task's lease at dst up to src's token, done where src's is; False if nothing to do."""
    lease = src.lease(task)
    held = dst.lease(task)
    if lease is None or (held is not None and held.token >= lease.token):
        return False
    token, new = held.token if held is not None else 0, None
    while token < lease.token:  # each claim of our own (ttl 0) moves the token one on
        new = dst.claim(task, owner, 0.0)
        if new is None:
            raise CopyRefused(
                f"task {task} is held by a live worker at {dst.path}; stop the workers serving run "
                f"{task.split('/')[0]} there, then copy again"
            )
        token = new.token
    assert new is not None
    if src.is_done(task):
        dst.append([], fence=new, complete=True)
    else:
        dst.release(new)
    return True


def copy_key(run_id: str, events: int) -> str:
    """The key of the RunCopied that closes a copy of the run's first `events` events: one per copy, so
    copying the same log again appends it once."""
    return f"{run_id}/copied/{events}"


def _where(store: Store) -> str:
    """The store's location as a RunCopied records it: a file's absolute path, a URL masked."""
    return store.path if is_url(store.path) else os.path.abspath(store.path)


def _held(src: Store, dst: Store, run_id: str, events: list[StoredEvent], there: list[StoredEvent]) -> None:
    """Refuse, before anything is written, a dst whose events of the run are not the source's first
    ones, followed at most by the RunCopied of this very copy."""
    differ = next((i for i, (a, b) in enumerate(zip(events, there, strict=False)) if not _same(a, b)), None)
    if differ is not None:
        first = there[differ]
        raise CopyRefused(
            f"{dst.path} already holds {len(there)} events of run {run_id} that differ from those at "
            f"{src.path} (from its event #{first.seq}, {first.type} {first.key}); nothing copied. Copy "
            "into another database, or compare them with `kb events`"
        )
    mark = copy_key(run_id, len(events)) if events[-1].type != "RunCopied" else None
    ahead = [e for e in there[len(events) :] if e.key != mark]
    if ahead:
        raise CopyRefused(
            f"{dst.path} already holds {len(ahead)} more events of run {run_id} than {src.path} (from its "
            f"event #{ahead[0].seq}, {ahead[0].type} {ahead[0].key}): the run went on there; nothing copied. "
            "Copy it the other way, or into another database"
        )


def _mark(src: Store, dst: Store, run_id: str, events: list[StoredEvent]) -> None:
    """Append the RunCopied after the copied events: their seqs at src, which the bases of the decisions
    among them are written in. It takes the last event's time, so every copy of one log is the same log;
    its key is the copy's, so it is appended once."""
    seqs = dst.put_blob(orjson.dumps([e.seq for e in events]))
    mark = RunCopied(source=_where(src), events=len(events), seqs=seqs)
    dst.append([mark.to_new(run_id, copy_key(run_id, len(events)), "cli")], ts=[events[-1].ts])


def copy_run(src: Store, dst: Store, run_id: str) -> CopyReport:
    """Copy run_id from src to dst and verify it there; CopyRefused when dst's differs or it fails."""
    require_run(src, run_id)
    events = list(src.iter_events(run_id=run_id))
    source = replay(src, run_id)
    if not source.agrees:
        raise CopyRefused(
            f"run {run_id} at {src.path} does not replay ({source.divergences[0]}), so no copy of it could "
            f"be verified; nothing copied. `kb replay {run_id}` there lists every divergence"
        )
    there = dst.read(run_id=run_id)
    _held(src, dst, run_id, events, there)
    rest = events[len(there) :]
    blobs = 0
    for h in blob_names(rest):  # blobs first: an event never names a blob the destination lacks
        try:
            data = src.get_blob(h)
        except KeyError:
            continue  # a string shaped like a name, naming nothing
        if dst.put_blob(data) != h:
            raise CopyRefused(f"blob {h} at {src.path} does not hash to its name; the source is damaged")
        blobs += 1
    for i in range(0, len(rest), BATCH):
        chunk = rest[i : i + BATCH]
        new = [
            NewEvent(e.run_id, e.type, e.version, e.key, e.payload, e.actor, e.subject, e.stage)
            for e in chunk
        ]
        dst.append(new, ts=[e.ts for e in chunk])
    # not where a RunCopied of the log itself maps every basis in it, nor where dst held them all already
    same_seqs = [e.seq for e in there[: len(events)]] == [e.seq for e in events]
    if events[-1].type != "RunCopied" and not same_seqs:
        _mark(src, dst, run_id, events)
    owner = owner_id("copy")
    tasks = dict.fromkeys(e.payload["task"] for e in events if e.type == "TaskClaimed")
    leases = sum(_copy_lease(src, dst, task, owner) for task in tasks)
    try:
        report = verify(src, dst, run_id, source)
    except CopyRefused as e:
        raise CopyRefused(
            f"{e}. {dst.path} keeps the copy as written (the run's {len(events)} events, their blobs and "
            "leases), unverified, since a log is never rewritten; `kb db copy` again adds nothing and "
            "verifies it anew"
        ) from e
    return CopyReport(run_id, len(rest), min(len(there), len(events)), blobs, leases, report)


def verify(src: Store, dst: Store, run_id: str, source: ReplayReport) -> ReplayReport:
    """The run at dst folds to the state it has at src, and replays without divergence to as many events
    and decisions as `source`, src's replay."""
    want, got = status_dict(load_state(src, run_id)), status_dict(load_state(dst, run_id))
    if want != got:
        diff = sorted(k for k in want if want[k] != got.get(k))
        raise CopyRefused(
            f"the copy of run {run_id} at {dst.path} folds to another state ({', '.join(diff)})"
        )
    report = replay(dst, run_id)
    if not report.agrees:
        raise CopyRefused(f"the copy of run {run_id} at {dst.path} does not replay: {report.divergences[0]}")
    if (report.events, report.decisions) != (source.events, source.decisions):
        raise CopyRefused(
            f"the copy of run {run_id} at {dst.path} replays {report.events} events and {report.decisions} "
            f"decisions, not the source's {source.events} and {source.decisions}"
        )
    return report
