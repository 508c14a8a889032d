"""The operations a sandboxed child serves, by request type, and the check that no candidate replaced a
clock or a synchronisation point in this process."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import torch

from kernelbrain.child import guard
from kernelbrain.child.analysis import analyse
from kernelbrain.child.gate import trial
from kernelbrain.child.judge import draws, judge
from kernelbrain.child.launchers import build
from kernelbrain.child.loading import give_fits, problems_tampered
from kernelbrain.child.profile import ncu, roofline
from kernelbrain.child.timing import bench, duel, reference_time
from kernelbrain.core.protocol import (
    AnalyseRequest,
    BenchRequest,
    DrawsRequest,
    DuelRequest,
    JudgeRequest,
    LaunchersRequest,
    Message,
    NcuRequest,
    ProblemRequest,
    ReferenceTimeRequest,
    Request,
    RooflineRequest,
    TrialRequest,
)

OPS: dict[type[Request], Callable[..., dict]] = {
    DrawsRequest: draws,
    TrialRequest: trial,
    JudgeRequest: judge,
    LaunchersRequest: build,
    BenchRequest: bench,
    ReferenceTimeRequest: reference_time,
    DuelRequest: duel,
    AnalyseRequest: analyse,
    RooflineRequest: roofline,
    NcuRequest: ncu,
}


def serve(request: Request) -> Message:
    """Run one request: its op's function on the request's fields, its result validated as the reply. A
    problem's fits (from the run's analysis) are handed to every Problem the op loads."""
    if isinstance(request, ProblemRequest):
        give_fits(request.problem_source, request.fits)
    result = OPS[type(request)](**request.model_dump(exclude={"op", "fits"}))
    return request.reply.model_validate(result)


# cached CUDA memory past this is handed back after a request (see release_memory)
RELEASE_ABOVE = 1 << 30


def release_memory() -> None:
    """Hand the CUDA caching allocator's free blocks back after a request: a run's children share one GPU,
    and what one keeps cached (tens of gigabytes at KernelBench's full sizes) the next one's bench or
    draws cannot allocate."""
    if torch.cuda.is_initialized() and torch.cuda.memory_reserved() > RELEASE_ABOVE:
        gc.collect()
        torch.cuda.empty_cache()


_PRISTINE = guard.timer_identities()
_THREADS = set(threading.enumerate())


def settle() -> None:
    """Take the threads running now as the child's own: kb's warm-up (no candidate code) ran."""
    _THREADS.update(threading.enumerate())


def tainted() -> bool:
    """Whether a candidate replaced a clock, a synchronisation point or anything of torch's or of the
    problem's in this process, or left a thread, a process, a signal handler or timer behind: the next
    request gets a fresh child."""
    timers = bool(guard.moved(_PRISTINE, guard.timer_identities()))
    threads = any(t.is_alive() and t not in _THREADS for t in threading.enumerate())
    tampered = guard.torch_tampered() or guard.tables_changed()
    return timers or threads or tampered or problems_tampered() or guard.left_behind()
