"""The operations a sandboxed child serves, by request type, and the check that no candidate replaced a
clock or a synchronisation point in this process."""

from __future__ import annotations

import gc
import threading

import torch

from kernelbrain.child import guard, kept, memory
from kernelbrain.child.analysis import analyse
from kernelbrain.child.gate import trial
from kernelbrain.child.judge import draws, judge
from kernelbrain.child.launchers import build
from kernelbrain.child.loading import give_accuracy, give_fits, problems_tampered
from kernelbrain.child.profile import ncu, roofline
from kernelbrain.child.timing import bench, duel, reference_time
from kernelbrain.core.protocol import (
    AnalyseReply,
    AnalyseRequest,
    AnyRequest,
    BenchReply,
    BenchRequest,
    DrawsRequest,
    DuelReply,
    DuelRequest,
    JudgeRequest,
    KeptRequest,
    LaunchersReply,
    LaunchersRequest,
    Message,
    NcuReply,
    NcuRequest,
    ProblemRequest,
    ReferenceTimeReply,
    ReferenceTimeRequest,
    RooflineReply,
    RooflineRequest,
    TrialRequest,
)


def serve(request: AnyRequest) -> Message:
    """Run one request: its op on the request's fields, its reply a model of the request's reply type. A
    problem's fits (from the run's analysis) are handed to every Problem the op loads. The gate's ops
    take their request and return their reply; the others keep the plain signatures tools and tests call
    them by, and their documents are validated here."""
    if isinstance(request, ProblemRequest):
        give_fits(request.problem_source, request.fits)
        give_accuracy(request.problem_source, request.accuracy)
    r = request
    match r:
        case DrawsRequest():
            return draws(r)
        case TrialRequest():
            return trial(r)
        case JudgeRequest():
            return judge(r)
        case LaunchersRequest():
            return LaunchersReply.model_validate(build(r.signatures))
        case BenchRequest():
            memory.injected()
            timed = bench(
                r.problem_source, r.cand_source, r.device, r.which, r.repeats, r.warmup, r.torch_ops, r.outbox
            )
            return BenchReply.model_validate(timed)
        case KeptRequest():
            return kept.check(r)
        case ReferenceTimeRequest():
            alone = reference_time(r.problem_source, r.device, r.which, r.calls, r.repeats, r.warmup, r.fresh)
            return ReferenceTimeReply.model_validate(alone)
        case DuelRequest():
            ops = (r.a_torch_ops, r.b_torch_ops)
            ratios = duel(
                r.problem_source,
                r.a_source,
                r.b_source,
                r.device,
                r.which,
                r.repeats,
                r.warmup,
                ops,
                r.outbox,
            )
            return DuelReply.model_validate(ratios)
        case AnalyseRequest():
            return AnalyseReply.model_validate(analyse(r.problem_source, r.device))
        case RooflineRequest():
            profiled = roofline(r.problem_source, r.cand_source, r.device, r.repeats, r.flops, r.nbytes)
            return RooflineReply.model_validate(profiled)
        case NcuRequest():
            return NcuReply.model_validate(ncu(r.problem_source, r.cand_source, r.device, r.timeout_s))


# past this much cached CUDA memory a request's garbage is collected first (see release_memory)
COLLECT_ABOVE = 1 << 30


def release_memory() -> None:
    """Hand the CUDA caching allocator's free blocks back after a request: a pool's children share one
    GPU, and what each idle one keeps cached (up to a gigabyte apiece seen on an 80 GB H100 while a batch
    ran, tens of gigabytes at KernelBench's full sizes) the next bench or timing cannot allocate. Garbage
    is collected first only where much is cached: a collection costs tens of milliseconds a request."""
    if not torch.cuda.is_initialized():
        return
    if torch.cuda.memory_reserved() > COLLECT_ABOVE:
        gc.collect()
    if torch.cuda.memory_reserved():
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
