"""Entry point of a sandboxed child: `python -m kernelbrain.child`.

Speaks length-prefixed orjson frames on a private copy of stdout; the real stdout is pointed at stderr
so a candidate's prints cannot corrupt the protocol. Exits when its parent closes stdin.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import sys
import time
import traceback

import orjson

HEADER = struct.Struct("<I")


def _read_exact(stream, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return b""
        buf += chunk
    return buf


def _log_execution(request: dict) -> None:
    """Append one line per executed request when KB_EXEC_LOG is set: tests count real executions."""
    path = os.environ.get("KB_EXEC_LOG")
    if path:
        line = f"{time.time():.6f} {request.get('task', '-')} {request['op']}\n".encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _init_cuda() -> None:
    """Make the CUDA context now, while the worker waits for its first task: it costs a second or two,
    which a warm child would otherwise add to its first candidate. A failure here is left to that
    task to report."""
    import torch

    with contextlib.suppress(Exception):
        torch.empty(1, device="cuda").zero_()
        torch.cuda.synchronize()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when we stop
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer

    from kernelbrain.evaluate import OPS, CandidateFault, tainted  # imports torch: after the protocol is safe

    if os.environ.get("KB_WARM_CUDA") == "1":
        _init_cuda()

    while True:
        header = _read_exact(inp, HEADER.size)
        if not header:
            return
        request = orjson.loads(_read_exact(inp, HEADER.unpack(header)[0]))
        _log_execution(request)
        started = time.perf_counter()
        try:
            reply = {"ok": True, "result": OPS[request["op"]](**request["args"])}
        except CandidateFault as f:  # the candidate failed a check: a verdict on it, not kb's failure
            reply = {"ok": False, "error": f.detail, "category": f.category}
        except Exception as e:
            reply = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc()[-4000:],
            }
        reply["busy_s"] = time.perf_counter() - started
        reply["recycle"] = tainted()  # a candidate changed process-wide state: do not reuse this child
        frame = orjson.dumps(reply, option=orjson.OPT_SERIALIZE_NUMPY)
        out.write(HEADER.pack(len(frame)) + frame)


if __name__ == "__main__":
    main()
