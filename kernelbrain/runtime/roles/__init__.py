"""The five worker roles, one module each, by name."""

from kernelbrain.runtime.role import Role
from kernelbrain.runtime.roles.benchmarker import BenchmarkerRole
from kernelbrain.runtime.roles.gatekeeper import GatekeeperRole
from kernelbrain.runtime.roles.generator import GeneratorRole
from kernelbrain.runtime.roles.profiler import ProfilerRole
from kernelbrain.runtime.roles.scheduler import SchedulerRole

ROLES = ("generator", "gatekeeper", "benchmarker", "profiler", "scheduler")
# roles one worker process steps in turn, sharing its sandbox children (runtime/worker.py's Crew)
CREWS = {"candidates": ("gatekeeper", "benchmarker", "profiler")}
ROLE_CLASSES: dict[str, type[Role]] = {
    r.name: r for r in (GeneratorRole, GatekeeperRole, BenchmarkerRole, ProfilerRole, SchedulerRole)
}


def processes(device: str) -> tuple[str, ...]:
    """The worker processes `kb run` starts for a run on `device`, by role or crew name. On a GPU each
    role has its own, so that compiles and gates overlap the timed work; on a CPU the candidate roles
    share one (the Triton interpreter is the work there, and a child's torch import per role would be
    most of a small run's CPU)."""
    return ROLES if device == "cuda" else ("generator", "candidates", "scheduler")


__all__ = [
    "CREWS",
    "ROLES",
    "ROLE_CLASSES",
    "BenchmarkerRole",
    "GatekeeperRole",
    "GeneratorRole",
    "ProfilerRole",
    "SchedulerRole",
    "processes",
]
