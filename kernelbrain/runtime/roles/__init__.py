"""The five worker roles, one module each, by name."""

from kernelbrain.runtime.role import Role
from kernelbrain.runtime.roles.benchmarker import BenchmarkerRole
from kernelbrain.runtime.roles.gatekeeper import GatekeeperRole
from kernelbrain.runtime.roles.generator import GeneratorRole
from kernelbrain.runtime.roles.profiler import ProfilerRole
from kernelbrain.runtime.roles.scheduler import SchedulerRole

ROLES = ("generator", "gatekeeper", "benchmarker", "profiler", "scheduler")
# roles one worker process steps in turn, sharing its sandbox children (runtime/worker.py's Crew)
CREWS = {"candidates": ("gatekeeper", "benchmarker", "profiler"), "all": ROLES}
ROLE_CLASSES: dict[str, type[Role]] = {
    r.name: r for r in (GeneratorRole, GatekeeperRole, BenchmarkerRole, ProfilerRole, SchedulerRole)
}


def worker_processes(device: str, generator: str) -> tuple[str, ...]:
    """The worker processes `kb run` starts for a run, by role or crew name. On a GPU each role has its
    own, so that compiles and gates overlap the timed work. On a CPU the Triton interpreter is the work,
    and a child's torch import per role would be most of a small run's CPU: one process steps every
    role, with one candidate child and one judge (which also traces the analysis). The LLM generator
    keeps a process of its own there, the only one started with the API key in its environment."""
    if device == "cuda":
        return ROLES
    return ("all",) if generator != "llm" else ("generator", "candidates", "scheduler")


def pool_processes(device: str, generator: str, cpus: int) -> list[str]:
    """The worker processes `kb run` starts for a batch, by role or crew name (a name may repeat). On a
    GPU: the roles whose work is the host's (analysis, compiles, gates at fitted shapes) spread over its
    cores; a benchmarker per 4 cores (at least two), the others preparing their rungs (sharing the GPU)
    while one times (alone: runtime/gpu_lock.py); one profiler; one scheduler. On a CPU one process steps
    every role per core (the interpreter is the work)."""
    if device == "cuda":
        generators = ["generator"] * max(1, cpus // 8)
        # in the H100 sweep's second piece two benchmarkers prepared 1.7 s a rung (median) for 0.7 s alone,
        # and the GPU was held alone 24% of the time: more of them overlap the preparations
        benchmarkers = ["benchmarker"] * max(2, cpus // 4)
        # a gatekeeper per 2 cores: its gates compile single-threaded, and in the H100 sweep's first piece
        # (one per 4 cores) the four were 85% busy while most of the 16 cores and the GPU waited on them
        return [*generators, *["gatekeeper"] * max(1, cpus // 2), *benchmarkers, "profiler", "scheduler"]
    if generator == "llm":
        return ["generator", *["candidates"] * max(1, cpus), "scheduler"]
    return ["all"] * max(1, cpus)


__all__ = [
    "CREWS",
    "ROLES",
    "ROLE_CLASSES",
    "BenchmarkerRole",
    "GatekeeperRole",
    "GeneratorRole",
    "ProfilerRole",
    "SchedulerRole",
    "pool_processes",
    "worker_processes",
]
