"""`kb replay`: rebuild the projections from the log and recompute every scheduler decision.

Each decision records the seq of the last event its scheduler had folded (`basis`), which names a
prefix of the run's events. Replay folds the run to each such prefix in turn, asks the recorded policy
version to decide, and requires every recorded decision to be among the recomputed ones with identical
numbers. A finished run must also be complete: at its last event the policy has nothing left to decide.

A run copied from another store (`kb db copy`) keeps its events' order but not their seqs. The copy
appends a RunCopied event listing the source's seqs of every event before it, so a decision with a
RunCopied after it has its basis read through the first such event: the same prefix, in the store
where it was decided. A chain of copies needs nothing more, since every copy keeps every prefix.
"""

from __future__ import annotations

import bisect
import copy
import itertools
from collections import defaultdict

import orjson
from pydantic import BaseModel

from kernelbrain.core.events import DECISION_TYPES, EVENT_TYPES, Event, EventError, RunCopied, decode
from kernelbrain.core.policy import decision_key, policy_for
from kernelbrain.core.state import RunState
from kernelbrain.store import Store, StoredEvent


class ReplayReport(BaseModel):
    run_id: str
    events: int  # the run's own events (a copy's RunCopied records are not among them)
    candidates: int
    decisions: int
    policy_version: int
    divergences: list[str]
    # the event replay stopped at, one this kb cannot read (a newer kb's type or schema version): why
    stopped: str | None = None

    @property
    def agrees(self) -> bool:
        return not self.divergences and self.stopped is None


def _newer(raw: StoredEvent) -> bool:
    """Whether a newer kb wrote the event: its type or its schema version is unknown to this one."""
    cls = EVENT_TYPES.get(raw.type)
    return cls is None or raw.version > cls.VERSION


def _stop_at(events: list[StoredEvent]) -> tuple[list[StoredEvent], str | None]:
    """The events up to the first one a newer kb wrote, and why replay stops there (None: it does not).
    Whatever follows such an event rests on it, so checking on would report its consequences as
    divergences of their own."""
    for i, raw in enumerate(events):
        if _newer(raw):
            try:
                decode(raw)
            except EventError as e:
                why = str(e)
            else:  # pragma: no cover - decode refuses every event _newer names
                why = f"event #{raw.seq} ({raw.type}) is a newer kb's"
            return events[:i], f"{why} ({len(events) - i - 1} later events not replayed)"
    return events, None


def _copied_seqs(store: Store, raw: StoredEvent, before: int) -> list[int] | str:
    """The source's seqs of the `before` events ahead of this RunCopied, or why they cannot be had."""
    try:
        mark = decode(raw)
        assert isinstance(mark, RunCopied)
        seqs = orjson.loads(store.get_blob(mark.seqs))
    except EventError as e:
        return str(e)
    except KeyError:
        return f"#{raw.seq} RunCopied: its blob of source seqs is missing"
    except orjson.JSONDecodeError:
        return f"#{raw.seq} RunCopied: its blob of source seqs is not JSON"
    well_formed = isinstance(seqs, list) and all(isinstance(s, int) for s in seqs)
    if not well_formed or len(seqs) != before or any(a >= b for a, b in itertools.pairwise(seqs)):
        return f"#{raw.seq} RunCopied: its blob does not hold {before} increasing seqs, one per event ahead"
    return seqs


def _basis_seqs(store: Store, events: list[StoredEvent], divergences: list[str]) -> list[list[int] | None]:
    """For each event, the seqs its basis (if it is a decision) is written in: this log's, or the
    source's from the first RunCopied after it; None where that RunCopied is damaged (a divergence)."""
    here = [e.seq for e in events]
    out: list[list[int] | None] = [here] * len(events)
    space: list[int] | None = here
    for i in range(len(events) - 1, -1, -1):
        out[i] = space
        if events[i].type == "RunCopied":
            seqs = _copied_seqs(store, events[i], i)
            if isinstance(seqs, str):
                divergences.append(seqs)
                space = None
            else:
                space = seqs
    return out


def replay(store: Store, run_id: str) -> ReplayReport:
    events, stopped = _stop_at(store.read(run_id=run_id))
    divergences: list[str] = []
    spaces = _basis_seqs(store, events, divergences)
    here = [e.seq for e in events]
    # the prefix length each decision rests on -> (its seq, the decision, the seqs its basis is written in)
    by_prefix: dict[int, list[tuple[int, Event, list[int]]]] = defaultdict(list)
    for raw, space in zip(events, spaces, strict=True):
        if raw.type not in DECISION_TYPES or space is None:
            continue
        try:
            d = decode(raw)
        except EventError:
            continue  # the fold below reports it
        by_prefix[bisect.bisect_right(space, d.basis)].append((raw.seq, d, space))  # type: ignore[attr-defined]
    state = RunState(run_id)
    i = 0
    policy = None
    for prefix in sorted(by_prefix):
        while i < prefix:
            try:
                state.apply(events[i])
            except EventError as e:
                divergences.append(str(e))
                state.position = events[i].seq
            i += 1
        decided = by_prefix[prefix]
        if state.started is None:
            divergences += [
                f"#{seq} {d.TYPE} {getattr(d, 'candidate', '')}: its basis #{d.basis} comes before the "  # type: ignore[attr-defined]
                "run's RunStarted"
                for seq, d, _ in decided
            ]
            continue
        policy = policy or policy_for(state.config.policy_version)
        expected = {decision_key(run_id, d): d for d in policy.decide(state)}
        for seq, recorded, space in decided:
            key = decision_key(run_id, recorded)
            # the recomputed basis (this log's seq of the prefix's last event) in the recorded one's seqs
            basis = space[prefix - 1]
            where = "" if space is here else f" (#{here[prefix - 1]} here; the log was copied)"
            if key not in expected:
                divergences.append(
                    f"#{seq} {recorded.TYPE} {getattr(recorded, 'candidate', '')}: the policy "
                    f"does not make this decision at basis #{basis}{where}"
                )
                continue
            want, got = expected[key].model_copy(update={"basis": basis}), recorded
            if want != got:
                wanted, logged = want.model_dump(), got.model_dump()
                fields = [k for k in wanted if wanted[k] != logged.get(k)]
                divergences.append(
                    f"#{seq} {recorded.TYPE} {getattr(recorded, 'candidate', '')}: recomputed "
                    f"{', '.join(f'{f}={wanted[f]!r}' for f in fields)} but the log has "
                    f"{', '.join(f'{f}={logged[f]!r}' for f in fields)}{where}"
                )
    for raw in events[i:]:
        try:
            state.apply(raw)
        except EventError as e:
            divergences.append(str(e))
    if state.finished is not None and state.started is not None and stopped is None:
        probe = copy.copy(state)  # decide() only reads: a shallow copy with RunFinished set aside
        probe.finished = None
        missing = policy_for(state.config.policy_version).decide(probe)
        missing = [d for d in missing if d.TYPE != "RunFinished"]
        if missing:
            divergences.append(
                f"the run finished but the policy still decides {len(missing)} more: "
                + ", ".join(decision_key(run_id, d) for d in missing[:5])
            )
    return ReplayReport(
        run_id=run_id,
        events=sum(e.type != "RunCopied" for e in events),
        candidates=len(state.candidates),
        decisions=sum(len(v) for v in by_prefix.values()),
        policy_version=state.config.policy_version if state.started else 0,
        divergences=divergences,
        stopped=stopped,
    )
