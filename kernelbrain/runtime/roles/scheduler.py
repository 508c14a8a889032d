"""The scheduler role: claims nothing; appends the policy's decisions on the log prefix it has folded."""

from __future__ import annotations

from kernelbrain.core.policy import decision_key, policy_for
from kernelbrain.core.state import RunState
from kernelbrain.runtime.role import Role, Task
from kernelbrain.store import NewEvent


class SchedulerRole(Role):
    name = "scheduler"

    def tasks(self, state: RunState) -> list[Task]:
        return []

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        return []

    def decide(self, state: RunState) -> bool:
        decisions = policy_for(state.config.policy_version).decide(state)
        if not decisions:
            return False
        self.store.append(
            [self.new(state, d, decision_key(state.run_id, d)) for d in decisions],
            tracking=(f"scheduler/{state.run_id}", state.position),
        )
        return True
