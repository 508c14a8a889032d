"""The profiler role: the analytical roofline of each finalist, and Nsight Compute on a GPU."""

from __future__ import annotations

import time

from kernelbrain.core.diagnosis import ncu_labels, roofline_labels
from kernelbrain.core.events import Event, GateCategory, ProfileCaptured
from kernelbrain.core.protocol import NcuRequest, RooflineReply, RooflineRequest
from kernelbrain.core.state import RunState
from kernelbrain.runtime.device_room import Need
from kernelbrain.runtime.role import CandidateRole, Task, profile_need
from kernelbrain.store import NewEvent

# timed calls of the roofline: under the interpreter one call is seconds and its time only a smoke figure
ROOFLINE_REPEATS = {"cpu": 1, "cuda": 5}


class ProfilerRole(CandidateRole[RooflineReply]):
    """Nsight Compute where it can read the counters; the analytical roofline always, and in its place
    where ncu is absent or refuses (recorded as such)."""

    name = "profiler"

    def wants_warm(self, state: RunState) -> bool:
        """Once a candidate is measured at a rung: profiles come after the ladder's top rung."""
        return bool(state.ranking) and not state.problem_fault

    def tasks(self, state: RunState) -> list[Task]:
        return [Task(f"{state.run_id}/profile/{c.id}", c.id, state.top_rung) for c in state.profile_tasks()]

    def need(self, state: RunState) -> Need | None:
        """The roofline's reservation: a profile's, not a bench's (`profile_need`)."""
        return profile_need(state)

    @staticmethod
    def counts(state: RunState) -> tuple[float, float] | None:
        """The reference's FLOP and byte counts from the run's analysis (at the primary shape, where the
        roofline times the candidate), so the child need not count again; none where it failed."""
        a = state.analysis
        return (a.flops, a.bytes) if a is not None and a.error is None else None

    def request(self, task: Task, state: RunState) -> RooflineRequest:
        assert task.candidate is not None
        counts = self.counts(state)
        return RooflineRequest(
            problem_source=self.problem_source(state),
            device=state.config.device,
            fits=self.fits(state),
            accuracy=self.accuracy(state),
            cand_source=self.candidate_source(state, task.candidate),
            repeats=ROOFLINE_REPEATS[state.config.device],
            flops=counts[0] if counts else None,
            nbytes=counts[1] if counts else None,
        )

    def on_result(self, task: Task, r: RooflineReply) -> Event:
        assert task.candidate is not None
        metrics = r.model_dump()
        return ProfileCaptured(
            candidate=task.candidate, source="roofline", metrics=metrics, labels=roofline_labels(metrics)
        )

    def on_fault(self, task: Task, category: GateCategory, detail: str) -> Event:
        assert task.candidate is not None
        return ProfileCaptured(
            candidate=task.candidate,
            source="roofline",
            metrics={},
            labels=[f"profile failed ({category}): {detail}"],
        )

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        events = super().execute(task, state)  # the roofline, and its charge
        if state.config.device != "cuda":
            return events
        assert task.candidate is not None
        roof = ProfileCaptured.model_validate(events[0].payload)
        ncu_task = Task(f"{task.key}/ncu", task.candidate, task.rung)
        t0 = time.perf_counter()
        request = NcuRequest(
            problem_source=self.problem_source(state),
            device=state.config.device,
            fits=self.fits(state),
            accuracy=self.accuracy(state),
            cand_source=self.candidate_source(state, task.candidate),
        )
        timeout_s = self.timeout_s(state)
        need = self.need(state)  # the roofline's reservation too
        own = state.candidates[task.candidate].proposal.own_code  # marks where it reaches the device
        asked = self.consult(
            "cuda", request, timeout_s=timeout_s, task=ncu_task.key, started=t0, need=need, own_code=own
        )
        ncu = asked.reply
        error = asked.line if ncu is None else ncu.error
        if ncu is None or error is not None:
            profile = roof.model_copy(update={"note": f"ncu not used: {error}"})
        else:
            metrics = {**ncu.metrics, **{f"roofline_{k}": v for k, v in roof.metrics.items()}}
            profile = ProfileCaptured(
                candidate=task.candidate,
                source="ncu",
                metrics=metrics,
                labels=ncu_labels(ncu.metrics),
                report=self.store.put_blob(ncu.raw),
            )
        # the profile stands in for the roofline's event under the task's key; each part keeps its charge
        return [self.new(state, profile, task.key, task), events[1], self.cost(state, ncu_task, asked)]
