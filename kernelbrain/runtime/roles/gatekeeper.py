"""The gatekeeper role: V(p) on each proposed candidate, in its sandboxed child; a candidate kb's own
templates did not write is first checked against kb's candidate subset, on the host."""

from __future__ import annotations

import time

from kernelbrain.core import subset
from kernelbrain.core.events import Event, GateCategory, GateFailed, GatePassed
from kernelbrain.core.protocol import GateReply, GateRequest
from kernelbrain.core.state import RunState
from kernelbrain.runtime.device_room import Need
from kernelbrain.runtime.role import CandidateRole, Task, gate_need
from kernelbrain.store import NewEvent


class GatekeeperRole(CandidateRole[GateReply]):
    name = "gatekeeper"
    warms_judge = True

    def need(self, state: RunState) -> Need | None:
        """A gate's memory at the gate's shapes, not a bench's."""
        return gate_need(state)

    def spare_wanted(self, task: Task, state: RunState) -> bool:
        """Whether another candidate kb did not write waits for the gate (its child is worth starting)."""
        return any(c.id != task.candidate and not c.proposal.own_code for c in state.gate_tasks())

    def wants_warm(self, state: RunState) -> bool:
        """While a candidate may still come to the gate: a resumed run whose candidates are all judged and
        that proposes no more never starts the judge's child nor its own (a torch import each)."""
        if state.problem_fault:
            return False
        return state.analysis is None or bool(state.gate_tasks()) or bool(state.generation_tasks())

    def tasks(self, state: RunState) -> list[Task]:
        return [Task(f"{state.run_id}/gate/{c.id}", c.id) for c in state.gate_tasks()]

    def request(self, task: Task, state: RunState) -> GateRequest:
        assert task.candidate is not None
        return GateRequest(
            problem_source=self.problem_source(state),
            device=state.config.device,
            fits=self.fits(state),
            accuracy=self.accuracy(state),
            cand_source=self.candidate_source(state, task.candidate),
            seeds=state.config.gate_seeds,
            torch_ops=self.torch_classes(state, task.candidate),
        )

    def timeout_s(self, state: RunState) -> float:
        return state.config.gate_timeout_s

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        """V(p); but a candidate whose text kb did not write (an LLM's, `CandidateProposed.own_code`
        False) that is outside the candidate subset (core/subset.py) fails `policy` here, naming its
        line, before any child sees it."""
        assert task.candidate is not None
        t0 = time.perf_counter()
        if not state.candidates[task.candidate].proposal.own_code:
            source = self.candidate_source(state, task.candidate)
            refused = subset.check(source, self.torch_classes(state, task.candidate))
            if refused is not None:
                failed = GateFailed(candidate=task.candidate, category="policy", detail=refused)
                charge = self.charge(state, task, wall_s=time.perf_counter() - t0)
                return [self.new(state, failed, task.key, task), charge]
        return super().execute(task, state)

    def on_result(self, task: Task, r: GateReply) -> Event:
        assert task.candidate is not None
        if r.passed:
            return GatePassed(
                candidate=task.candidate,
                seeds=r.seeds,
                max_abs_err=r.max_abs_err,
                max_rel_err=r.max_rel_err,
                tolerance=r.tolerance,
                shapes=r.shapes,
            )
        return GateFailed(
            candidate=task.candidate,
            category=r.category,
            detail=r.detail,
            max_abs_err=r.max_abs_err,
            max_rel_err=r.max_rel_err,
        )

    def on_fault(self, task: Task, category: GateCategory, detail: str) -> Event:
        assert task.candidate is not None
        return GateFailed(candidate=task.candidate, category=category, detail=detail)
