"""Entry point of a sandboxed child: `python -m kernelbrain.child`.

Speaks kernelbrain.core.protocol (length-prefixed orjson frames of typed requests and replies) on a
private copy of stdout; the real stdout is pointed at stderr so a candidate's prints cannot corrupt the
protocol. Exits when its parent closes stdin.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
import traceback
from typing import BinaryIO

import orjson

from kernelbrain.core.protocol import HEADER, Envelope, Failure, Reply

_clock = time.perf_counter  # a request's busy seconds, read on a clock no candidate's patch reaches


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return b""
        buf += chunk
    return buf


def _log_execution(envelope: Envelope) -> None:
    """Append one line per executed request when KB_EXEC_LOG is set: tests count real executions."""
    path = os.environ.get("KB_EXEC_LOG")
    if path:
        line = f"{time.time():.6f} {envelope.task} {envelope.request.op}\n".encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _reply(frame: bytes) -> Reply:
    """The reply to one frame: the op's result, the candidate's failed check, or kb's own failure."""
    from kernelbrain.child import marks, tensorfile
    from kernelbrain.child.loading import CandidateFault
    from kernelbrain.child.ops import release_memory, serve, tainted
    from kernelbrain.core import descriptors

    started = _clock()
    result, failure = None, None
    tensorfile.new_request()
    marks.waited()  # what an earlier request waited is not this one's
    try:
        envelope = Envelope.model_validate(orjson.loads(frame))
        _log_execution(envelope)
        result = serve(envelope.request).model_dump(mode="json")
    except CandidateFault as f:  # the candidate failed a check: a verdict on it, not kb's failure
        failure = Failure(fault="candidate", category=f.category, detail=f.detail)
    except Exception as e:
        failure = _failure(e)
    descriptors.discard()  # what the judge received and did not read: its GPU memory goes now
    # before the reply: the worker lets the request's memory reservation go once it has read it, and the
    # next request admitted in its place must find the memory free (an H100 sweep's bench ran out of
    # memory a second after a 50 GiB one's reply)
    release_memory()
    # recycle: a candidate changed process-wide state, so this child is not reused (nor one that ran
    # out of memory)
    recycle = tainted() or (failure is not None and failure.fault == "memory")
    # its busy seconds leave out its waits for the device's lock (a gate's `device` marks, a timing's
    # `ready`: in an H100 sweep benches were charged 24 s of others' timings out of 25)
    return Reply(result=result, failure=failure, busy_s=_clock() - started - marks.waited(), recycle=recycle)


def _failure(e: Exception) -> Failure:
    """kb's own failure, or the pool's where the device ran out of memory (the candidate's own where it
    had the device to itself)."""
    from kernelbrain.child import memory
    from kernelbrain.child.loading import CandidateFault

    if memory.out_of_memory(e):
        e = memory.verdict(e, "the request")
    if isinstance(e, memory.DeviceBusy):
        return Failure(fault="memory", detail=str(e))
    if isinstance(e, CandidateFault):
        return Failure(fault="candidate", category=e.category, detail=e.detail)
    return Failure(fault="kb", detail=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-4000:])


def _warm() -> None:
    """The CUDA context and a first kernel of kb's own (kernelbrain.child.warm), before any candidate."""
    import kernelbrain.child.ops
    from kernelbrain.child.warm import warm_cuda

    warm_cuda()
    kernelbrain.child.ops.settle()


def main() -> None:
    from kernelbrain.child import limits

    limits.apply(sys.argv)  # its memory and process caps, and its own uid: before anything else runs
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when we stop
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer

    from kernelbrain.child import marks

    # the timed batches' marks go on the protocol pipe, between replies; `ready` reads the answer
    marks.channel(out.write, lambda n: _read_exact(inp, n))
    import kernelbrain.child.ops  # noqa: F401  (imports torch and Triton: after the protocol is safe)
    from kernelbrain.child import lazy_dynamo

    lazy_dynamo.install()  # meta arithmetic (sizing, the analysis) leaves torch._dynamo unloaded: 1.5 s

    marks.compiles_off_device()  # before any candidate's code: kb's hooks

    warm = os.environ.get("KB_WARM_CUDA")  # "first": a spare's, at its first request (under the GPU lock)
    if warm == "1":
        _warm()
    # torch's, Triton's and kb's objects live as long as the child: the collections before timed samples
    # (child/timing.py) skip them, and take milliseconds rather than a tenth of a second
    gc.freeze()

    while True:
        header = _read_exact(inp, HEADER.size)
        if not header:
            return
        request = _read_exact(inp, HEADER.unpack(header)[0])
        if warm == "first":  # after the request is read whole: the mark's answer follows it on the pipe
            warm = None
            with marks.on_device():  # where the worker's hold of the device is a gate's, it takes it
                _warm()
            gc.freeze()
        frame = orjson.dumps(_reply(request).model_dump(mode="json"))
        out.write(HEADER.pack(len(frame)) + frame)


if __name__ == "__main__":
    main()
