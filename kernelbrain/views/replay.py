"""`kb replay`: rebuild the projections from the log and recompute every scheduler decision.

Each decision records the seq of the last event its scheduler had folded (`basis`). Replay folds the
run to each basis in turn, asks the recorded policy version to decide, and requires every recorded
decision to be among the recomputed ones with identical numbers. A finished run must also be
complete: at its last event the policy has nothing left to decide.
"""

from __future__ import annotations

import copy
from collections import defaultdict

from pydantic import BaseModel

from kernelbrain.core.events import DECISION_TYPES, Event, EventError, decode
from kernelbrain.core.policy import decision_key, policy_for
from kernelbrain.core.state import RunState
from kernelbrain.store import Store


class ReplayReport(BaseModel):
    run_id: str
    events: int
    candidates: int
    decisions: int
    policy_version: int
    divergences: list[str]

    @property
    def agrees(self) -> bool:
        return not self.divergences


def replay(store: Store, run_id: str) -> ReplayReport:
    events = store.read(run_id=run_id)
    by_basis: dict[int, list[tuple[int, Event]]] = defaultdict(list)
    for raw in events:
        if raw.type in DECISION_TYPES:
            d = decode(raw)
            by_basis[d.basis].append((raw.seq, d))  # type: ignore[attr-defined]
    state = RunState(run_id)
    divergences: list[str] = []
    i = 0
    policy = None
    for basis in sorted(by_basis):
        while i < len(events) and events[i].seq <= basis:
            try:
                state.apply(events[i])
            except EventError as e:
                divergences.append(str(e))
                state.position = events[i].seq
            i += 1
        policy = policy or policy_for(state.config.policy_version)
        expected = {decision_key(run_id, d): d for d in policy.decide(state)}
        for seq, recorded in by_basis[basis]:
            key = decision_key(run_id, recorded)
            if key not in expected:
                divergences.append(
                    f"#{seq} {recorded.TYPE} {getattr(recorded, 'candidate', '')}: the policy "
                    f"does not make this decision at basis #{basis}"
                )
            elif expected[key] != recorded:
                want, got = expected[key].model_dump(), recorded.model_dump()
                fields = [k for k in want if want[k] != got.get(k)]
                divergences.append(
                    f"#{seq} {recorded.TYPE} {getattr(recorded, 'candidate', '')}: recomputed "
                    f"{', '.join(f'{f}={want[f]!r}' for f in fields)} but the log has "
                    f"{', '.join(f'{f}={got[f]!r}' for f in fields)}"
                )
    for raw in events[i:]:
        try:
            state.apply(raw)
        except EventError as e:
            divergences.append(str(e))
    if state.finished is not None:
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
        events=len(events),
        candidates=len(state.candidates),
        decisions=sum(len(v) for v in by_basis.values()),
        policy_version=state.config.policy_version if state.started else 0,
        divergences=divergences,
    )
