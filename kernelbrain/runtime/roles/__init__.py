"""The five worker roles, one module each, by name."""

from kernelbrain.runtime.role import Role
from kernelbrain.runtime.roles.benchmarker import BenchmarkerRole
from kernelbrain.runtime.roles.gatekeeper import GatekeeperRole
from kernelbrain.runtime.roles.generator import GeneratorRole
from kernelbrain.runtime.roles.profiler import ProfilerRole
from kernelbrain.runtime.roles.scheduler import SchedulerRole

ROLES = ("generator", "gatekeeper", "benchmarker", "profiler", "scheduler")
ROLE_CLASSES: dict[str, type[Role]] = {
    r.name: r for r in (GeneratorRole, GatekeeperRole, BenchmarkerRole, ProfilerRole, SchedulerRole)
}

__all__ = [
    "ROLES",
    "ROLE_CLASSES",
    "BenchmarkerRole",
    "GatekeeperRole",
    "GeneratorRole",
    "ProfilerRole",
    "SchedulerRole",
]
