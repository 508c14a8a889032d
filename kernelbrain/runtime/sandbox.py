"""The worker's side of a sandboxed child: start it, send it work, survive whatever it does.

Candidate code is untrusted. It runs in its own process and session with a scrubbed environment, its
own temporary directory, no core dumps and capped file sizes, and it dies with its worker
(PR_SET_PDEATHSIG). A hang, a segfault, an illegal memory access or an `os._exit` becomes a
`SandboxFault` with its category; the next call starts a fresh child. A check the candidate fails
inside an op (the child's CandidateFault) is a `SandboxFault` too, with the check's category, and the
child lives on. A warm child is reused until one faults, because importing torch and Triton costs
seconds.

A gate runs across this child and its judge (runtime/gate.py); a bench times the reference again alone
in the judge (runtime/reference_retiming.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, TypeVar

import orjson
from pydantic import ValidationError

import kernelbrain
from kernelbrain.core.events import GateCategory
from kernelbrain.core.protocol import (
    HEADER,
    TRITON_SHARED_ENV,
    BenchRequest,
    CandidateRequest,
    DuelRequest,
    GateRequest,
    Message,
    NcuRequest,
    ReferenceTimeRequest,
    Reply,
    Request,
    RooflineRequest,
    TrialRequest,
)
from kernelbrain.runtime import gate, gpu_lock, isolation, limits, reference_retiming, scratch, triton_cache
from kernelbrain.runtime.environment import child_env_allowed
from kernelbrain.runtime.faults import ProblemFault, SandboxError, SandboxFault

__all__ = ["FILE_CAP", "TIMED", "ProblemFault", "Sandbox", "SandboxError", "SandboxFault", "child_limits"]

R = TypeVar("R", bound=Message)

# what times or profiles on the GPU: no other request may run there meanwhile (runtime/gpu_lock.py)
TIMED = (BenchRequest, DuelRequest, ReferenceTimeRequest, RooflineRequest, NcuRequest)
MAX_REPLY = 64 << 20  # replies are small JSON documents; more means something else wrote to the pipe

# the largest file a child may write: the judge writes a problem's drawn inputs, one file a tensor set,
# and a trial its outputs; KernelBench's reach 8.6 GB a tensor (a 4 GiB cap failed 100_HingeLoss's
# 4 GiB input). Still a bound on a candidate that writes without end
FILE_CAP = 64 << 30


def child_limits() -> None:
    """What every child starts with (a subprocess's preexec_fn): no SIGINT, no core dumps, files no larger
    than FILE_CAP, and death with its worker."""
    # ignored across exec: a SIGINT to the child's group (a terminal's Ctrl-C) must not stop a request
    # in a wrapper (bwrap) before the child itself ignores it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_CAP, FILE_CAP))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _sources(request: Request[Any]) -> list[str]:
    """The candidates a request runs."""
    if isinstance(request, DuelRequest):
        return [request.a_source, request.b_source]
    return [request.cand_source] if isinstance(request, CandidateRequest) else []


def _runs_candidate(request: Request[Any]) -> bool:
    return bool(_sources(request)) or isinstance(request, TrialRequest)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Sandbox:
    """One sandboxed child, started on first use and again after a fault, and the gate's judge beside
    it (a Sandbox of its own, started with `start_judge`)."""

    def __init__(
        self,
        device: str,
        *,
        gpu: int | None = None,
        warm_cuda: bool = True,
        writable: tuple[str, ...] = (),
        readable: tuple[str, ...] = (),
    ) -> None:
        self.device = device
        self.gpu = gpu
        self.warm_cuda = warm_cuda and device == "cuda"
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.tmp: Path | None = None
        self.executions = 0
        self.stderr_mark = 0
        self.isolation: isolation.Isolation | None = None  # chosen when the first child starts
        self.writable = writable  # host paths beside its own folder the child may write (tests' logs)
        self.readable = readable  # host folders the child may read (the judge: the candidate's outputs)
        self.judge: Sandbox | None = None  # the gate's judge: a child no candidate code runs in
        # the judge's draws, written by the judge and read-only to this child; the trial's outputs, written
        # by this child and read-only to the judge (both folders live as long as this Sandbox)
        self.draws: Path | None = None
        self.outbox: Path | None = None
        self.bound: tuple[str, ...] = ()  # the gate's folders this child was started with
        self.recycle_due = False  # a reply asked for a fresh child; held while its files are read
        self.gate_phases: dict[str, float] = {}  # the last gate's seconds per step (tools/gate_phases.py)
        self.bench_phases: dict[str, float] = {}  # the last bench's: the child's, the judge's, timings
        self.built: set[str] = set()  # the kernel signatures this sandbox's judge built launchers for
        # every candidate the child ran so far was kb's own template code: what it compiles may be shared
        self.own_code_only = True
        self.brought: set[str] = set()  # the Triton cache entries the child's last request found there

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if child_env_allowed(k)}
        assert self.tmp is not None
        env.update(HOME=str(self.tmp), TMPDIR=str(self.tmp), PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
        if self.warm_cuda:
            env["KB_WARM_CUDA"] = "1"  # the child makes its CUDA context while it waits (kernelbrain.child)
        env.setdefault("TRITON_CACHE_DIR", str(Path.home() / ".cache" / "kernelbrain" / "triton"))
        if self.isolation == "bwrap":
            # the child writes only its own folder: a shared cache would let one candidate replace
            # another's compiled kernels
            env.update(TRITON_CACHE_DIR=str(self.tmp / "triton"), USER="kb", LOGNAME="kb")
            env.update(TRITON_CACHE_MANAGER=triton_cache.MANAGER)
            env[TRITON_SHARED_ENV] = str(triton_cache.SHARED)
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu)
        # the child imports kernelbrain from wherever this worker did
        root = str(Path(kernelbrain.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def start(self) -> None:
        if self.proc is not None:
            return
        self.isolation = isolation.chosen()
        self.own_code_only = True
        self.brought = set()
        self.tmp = scratch.make("sandbox")
        self.stderr = open(self.tmp / "stderr.log", "wb")  # noqa: SIM115 - lives as long as the child
        writable = (*self.writable, *((str(self.outbox),) if self.outbox is not None else ()))
        if log := os.environ.get("KB_EXEC_LOG"):  # the tests' count of executed requests
            Path(log).touch()
            writable = (*writable, log)
        argv = [sys.executable, "-m", "kernelbrain.child"]
        self.bound = tuple(str(f) for f in (self.draws, self.outbox) if f is not None)
        readable = (*self.readable, *((str(self.draws),) if self.draws is not None else ()))
        if self.isolation == "bwrap":  # the compiled kernels every child reads, read-only
            triton_cache.SHARED.mkdir(parents=True, exist_ok=True)
            readable = (*readable, str(triton_cache.SHARED))
        self.proc = subprocess.Popen(
            isolation.wrap(self.isolation, argv, self.tmp, self.device, writable, readable),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            cwd=self.tmp,
            env=self._env(),
            start_new_session=True,
            preexec_fn=child_limits,
        )

    def call(
        self, request: Request[R], *, timeout_s: float, task: str = "-", own_code: bool = False
    ) -> tuple[R, float]:
        """Run one request; returns (its reply, busy seconds). Raises SandboxFault when the child dies or
        the candidate failed a check, SandboxError when kb's own code failed in the child. A gate runs
        across two children (runtime/gate.py), a bench times the reference alone after it
        (runtime/reference_retiming.py). `own_code`: its candidates are kb's own template code. On a
        GPU the request holds the GPU's lock: alone where it times or profiles."""
        if self.device != "cuda":
            reply, busy = self._dispatch(request, timeout_s=timeout_s, task=task, own_code=own_code)
        else:
            with gpu_lock.held(gpu_lock.gpu_name(self.gpu), alone=isinstance(request, TIMED)):
                reply, busy = self._dispatch(request, timeout_s=timeout_s, task=task, own_code=own_code)
        return request.parse_reply(reply), busy

    def _dispatch(
        self, request: Request[Any], *, timeout_s: float, task: str, own_code: bool
    ) -> tuple[Message, float]:
        if isinstance(request, GateRequest):
            return gate.gate(self, request, timeout_s=timeout_s, task=task, own_code=own_code)
        if sources := _sources(request):
            self.bring_compiled(sources)
        if isinstance(request, BenchRequest):
            bench = reference_retiming.bench(self, request, timeout_s=timeout_s, task=task, own_code=own_code)
            if own_code and self.own_code_only:  # what the rung's shapes compiled
                self.share_compiled()
            return bench
        return self.ask(request, timeout_s=timeout_s, task=task, own_code=own_code)

    def own_cache(self) -> Path | None:
        """This child's own Triton cache, where it has one (bubblewrap; the others share the host's)."""
        return self.tmp / "triton" if self.isolation == "bwrap" and self.tmp is not None else None

    def bring_compiled(self, sources: list[str]) -> None:
        """Start the child, empty its Triton cache of whatever an earlier candidate left there, and fill it
        with what the gate compiled for these candidates: their kernels load rather than compile."""
        self.start()
        cache = self.own_cache()
        if cache is None:
            return
        triton_cache.fill(cache, sources)
        self.brought = {e.name for e in cache.iterdir()}

    def share_compiled(self) -> None:
        """What this child compiled in its last request (not what was brought to it: the children that
        compiled that may have run code from outside), for every child."""
        cache = self.own_cache()
        if cache is not None:
            triton_cache.share(cache, self.brought)

    def keep_compiled(self, source: str) -> None:
        """What this child's Triton cache holds after a passing trial (emptied before it): the candidate's
        compiled kernels, kept once for the children that time it."""
        cache = self.own_cache()
        if cache is not None:
            triton_cache.keep_compiled(cache, source)

    def start_judge(self) -> Sandbox:
        """Start the gate's judge ahead of a first gate (a torch import, a CUDA context), and the folders
        of its draws and of the trial's outputs; the judge."""
        if self.draws is None or self.outbox is None:
            self.draws = scratch.make("draws")
            self.outbox = scratch.make("outbox", scratch.memory_folder())
        if self.judge is None:
            self.judge = Sandbox(
                self.device,
                gpu=self.gpu,
                warm_cuda=self.warm_cuda,
                writable=(*self.writable, str(self.draws)),
                readable=(str(self.outbox),),
            )
        self.judge.start()
        return self.judge

    def gate_folders(self) -> tuple[Path, Path]:
        """The judge's draws and the trial's outbox (made by `start_judge`)."""
        if self.draws is None or self.outbox is None:
            raise RuntimeError("the gate's folders are made by start_judge(), which has not run")
        return self.draws, self.outbox

    def recycle(self) -> None:
        """Stop the child if a reply asked for a fresh one."""
        if self.recycle_due:
            self.recycle_due = False
            self.stop()

    def ask(
        self,
        request: Request[R],
        *,
        timeout_s: float,
        task: str = "-",
        hold: bool = False,
        own_code: bool = False,
    ) -> tuple[R, float]:
        """One request to this child. `hold`: a reply that asks for a fresh child leaves this one (and
        its folder) until `recycle()`, so that its files can be read first. `own_code`: the candidates it
        runs are kb's own template code."""
        if self.proc is not None and self.proc.poll() is not None:
            # it died after its last answer (a stray thread of an earlier candidate): not this one's fault
            self.stop()
        if self.proc is None:
            self.start()
        if _runs_candidate(request) and not own_code:
            self.own_code_only = False  # until this process ends
        assert self.proc and self.proc.stdin and self.proc.stdout and self.stderr
        self.stderr_mark = self.stderr.tell()
        frame = orjson.dumps({"task": task, "request": request.model_dump(mode="json")})
        try:
            self.proc.stdin.write(HEADER.pack(len(frame)) + frame)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._fault("crash", self._died()) from None
        self.executions += 1
        try:
            reply = Reply.model_validate(self._read(time.monotonic() + timeout_s, timeout_s))
            result = None if reply.result is None else request.parse_reply(reply.result)
        except ValidationError:
            raise self._fault(
                "crash", "the child sent a malformed reply (candidate code wrote to the protocol pipe)"
            ) from None
        if why := limits.over_folder(self.tmp):  # its folder past the cap: stopped, the folder removed
            raise self._fault("policy", why)
        if reply.recycle:
            self.recycle_due = True
            if not hold:
                self.recycle()
        if reply.failure is not None and reply.failure.fault == "candidate":  # the child lives on
            raise SandboxFault(reply.failure.category or "runtime", reply.failure.detail)
        if reply.failure is not None or result is None:
            detail = reply.failure.detail if reply.failure else "no result"
            trace = reply.failure.trace if reply.failure else ""
            raise SandboxError(f"{request.op} failed inside the sandbox: {detail}\n{trace or ''}")
        return result, reply.busy_s

    def _read(self, deadline: float, timeout_s: float) -> object:
        """The child's next frame, as the JSON document it holds."""
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
        buf = b""
        need = HEADER.size
        header_done = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fault("timeout", f"no answer within {timeout_s:g} s; the child was killed")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, max(need - len(buf), 1 << 16))
            if not chunk:
                raise self._fault("crash", self._died())
            buf += chunk
            if not header_done and len(buf) >= HEADER.size:
                size = HEADER.unpack(buf[: HEADER.size])[0]
                if size > MAX_REPLY:
                    raise self._fault(
                        "crash", f"the child announced a {size}-byte reply: the protocol was corrupted"
                    )
                need = HEADER.size + size
                header_done = True
            if header_done and len(buf) >= need:
                try:
                    return orjson.loads(buf[HEADER.size : need])
                except orjson.JSONDecodeError as e:
                    raise self._fault("crash", f"the child sent a malformed reply: {e}") from None

    def _died(self) -> str:
        assert self.proc
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "the child closed its pipe but did not exit"
        sig = isolation.exit_signal(self.isolation or "none", code)
        how = f"was killed by {_signal_name(-sig)}" if sig is not None else f"exited with status {code}"
        return f"the child {how}{self._stderr_tail()}"

    def _stderr_tail(self) -> str:
        assert self.tmp
        try:
            with open(self.tmp / "stderr.log", "rb") as f:
                f.seek(self.stderr_mark)  # only what this request wrote
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f": {lines[-1][:300]}" if lines else ""

    def _fault(self, category: GateCategory, detail: str) -> SandboxFault:
        self.stop()
        return SandboxFault(category, detail)

    def close(self) -> None:
        """Stop the child and its judge, and remove the judge's draws."""
        self.stop()
        if self.judge is not None:
            self.judge.close()
            self.judge = None
        for folder in (self.draws, self.outbox):
            if folder is not None:
                scratch.remove(folder)
        self.draws = self.outbox = None

    def stop(self) -> None:
        """Stop the child (after a fault, or to recycle it); a judge lives on: no candidate ran there."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=5)
            for f in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(Exception):
                    if f is not None:
                        f.close()
            if self.stderr is not None:
                self.stderr.close()
            self.proc = None
        if self.tmp is not None:
            scratch.remove(self.tmp)
            self.tmp = None
