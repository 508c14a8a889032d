"""The gatekeeper role: V(p) on each proposed candidate, in its sandboxed child."""

from __future__ import annotations

from kernelbrain.core.events import Event, GateCategory, GateFailed, GatePassed
from kernelbrain.core.protocol import GateReply, GateRequest
from kernelbrain.core.state import RunState
from kernelbrain.runtime.role import CandidateRole, Task


class GatekeeperRole(CandidateRole[GateReply]):
    name = "gatekeeper"
    warms_judge = True

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
            cand_source=self.candidate_source(state, task.candidate),
            seeds=state.config.gate_seeds,
            torch_ops=self.torch_classes(state, task.candidate),
        )

    def timeout_s(self, state: RunState) -> float:
        return state.config.gate_timeout_s

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
