"""The worker's side of a sandboxed child: start it, send it work, survive whatever it does.

Candidate code is untrusted. It runs in its own process and session with a scrubbed environment, its
own temporary directory, no core dumps and capped file sizes, and it dies with its worker
(PR_SET_PDEATHSIG). A hang, a segfault, an illegal memory access or an `os._exit` becomes a
`SandboxFault` with its category; the next call starts a fresh child. A check the candidate fails
inside an op (the child's CandidateFault) is a `SandboxFault` too, with the check's category, and the
child lives on. A warm child is reused until one faults, because importing torch and Triton costs
seconds; but a request that runs a candidate from outside (an LLM's: `own_code` False) gets a child that
has run no other candidate, and that child is stopped after it: code in a process can patch what every
later request there relies on (Triton's launcher, a Tensor method) in ways no check of the namespaces
sees. A spare child is started as such a request begins where another is to follow (`call`'s `spare`).

A gate runs across this child and its judge (runtime/gate.py); a bench times the reference again alone
in the judge (runtime/reference_retiming.py).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, TypeVar

import orjson
from pydantic import ValidationError

import kernelbrain
from kernelbrain.core import descriptors
from kernelbrain.core.events import GateCategory
from kernelbrain.core.protocol import (
    GO,
    HEADER,
    TRITON_SHARED_ENV,
    BenchRequest,
    CandidateRequest,
    DuelRequest,
    GateRequest,
    JudgeRequest,
    KeptRequest,
    Message,
    NcuRequest,
    ReferenceTimeRequest,
    Reply,
    Request,
    RooflineRequest,
    TrialRequest,
)
from kernelbrain.runtime import (
    device_room,
    gate,
    gpu_lock,
    isolation,
    limits,
    reference_retiming,
    scratch,
    triton_cache,
)
from kernelbrain.runtime.child_process import Started, child_limits, died, end_process
from kernelbrain.runtime.environment import child_env_allowed
from kernelbrain.runtime.faults import DeviceBusy, ProblemFault, SandboxError, SandboxFault

__all__ = ["TIMED", "ProblemFault", "Sandbox", "SandboxError", "SandboxFault"]

R = TypeVar("R", bound=Message)

# what times or profiles on the GPU: no other request may run there meanwhile (runtime/gpu_lock.py)
TIMED = (BenchRequest, DuelRequest, ReferenceTimeRequest, RooflineRequest, NcuRequest)
# of those, what prepares sharing the device and holds it alone from its child's `ready` (child/marks.py);
# the last two profile: for kb's own code their lock is taken at their marks (`call`)
PREPARED = (BenchRequest, DuelRequest, RooflineRequest, NcuRequest)
# what reads a candidate child's outputs: the only requests its descriptors are sent with (any other judge
# request in between, a launcher build, ends by closing what it was sent)
READS_OUTPUTS = (JudgeRequest, KeptRequest)
MAX_REPLY = 64 << 20  # replies are small JSON documents; more means something else wrote to the pipe
MAX_MARKS = 1 << 20  # timed batches' marks in one reply's time (child/marks.py): 4 a pair of samples


def _sources(request: Request[Any]) -> list[str]:
    """The candidates a request runs."""
    if isinstance(request, DuelRequest):
        return [request.a_source, request.b_source]
    return [request.cand_source] if isinstance(request, CandidateRequest) else []


def _runs_candidate(request: Request[Any]) -> bool:
    return bool(_sources(request)) or isinstance(request, TrialRequest)


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
        fresh_untrusted: bool = True,
    ) -> None:
        """`fresh_untrusted`: a request that runs a candidate from outside gets a child that ran no other
        candidate, stopped after it (only tests that are not about it turn it off, to share one child)."""
        self.device = device
        self.gpu = gpu
        self.warm_cuda = warm_cuda and device == "cuda"
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.tmp: Path | None = None
        self.executions = 0
        self.last_hold: gpu_lock.Hold | None = None  # the device lock's last hold (call)
        self.hold: gpu_lock.Hold | None = None  # the one a call holds now: a child's `ready` goes alone
        self.times = False  # the call in flight times (a gate's child may not mark itself ready)
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
        # the last request's timed batches, as the child marked them: (label, this worker's monotonic time)
        self.marks: list[tuple[str, float]] = []
        self.pending = b""  # what the child wrote past the frames read so far
        self.pending_at = 0.0  # when its last part came in
        self.fresh_untrusted = fresh_untrusted
        self.ran_candidate = False  # the child has run some candidate's code: no place for one from outside
        self.spare: Started | None = None  # a child started ahead of the next candidate from outside
        self.spares = True  # whether the caller expects another candidate from outside after this one
        self.channel: socket.socket | None = None  # the child's descriptors' socket (core/descriptors.py)
        self.cgroup: Path | None = None  # the child's own cgroup (runtime/limits.py), where it has one
        # descriptors for this child (a judge's: the candidate child's GPU outputs), for its next request
        self.incoming: list[tuple[str, int]] = []
        self.given: list[tuple[str, int]] = []  # and those it gave during its current request

    def _env(self, tmp: Path, chosen: isolation.Isolation, spare: bool = False) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if child_env_allowed(k)}
        env.update(HOME=str(tmp), TMPDIR=str(tmp), PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
        if self.warm_cuda:
            # the child makes its CUDA context while it waits (kernelbrain.child); a spare, started while
            # another request may be timing on the GPU, at its first request, under the GPU's lock
            env["KB_WARM_CUDA"] = "first" if spare else "1"
        env.setdefault("TRITON_CACHE_DIR", str(Path.home() / ".cache" / "kernelbrain" / "triton"))
        if chosen == "bwrap":
            # the child writes only its own folder: a shared cache would let one replace another's kernels
            env.update(TRITON_CACHE_DIR=str(tmp / "triton"), USER="kb", LOGNAME="kb")
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

    def start(self, lazy: bool = False) -> None:
        """Start the child, or take the spare where it was started with the same folders. Within a lazy
        hold (a gate's, `lazy`, or this Sandbox's own), it makes its CUDA context at its first request,
        under the lock (child/marks.py), as a spare does: the hold is let go while it starts."""
        if self.proc is not None:
            return
        spare, self.spare = self.spare, None
        if spare is not None and (spare.bound != self._bound() or spare.proc.poll() is not None):
            spare.end()
            spare = None
        child = spare or self._spawn(spare=lazy or (self.hold is not None and self.hold.lazy))
        self.proc, self.stderr, self.tmp = child.proc, child.stderr, child.tmp
        self.isolation, self.bound, self.channel = child.level, child.bound, child.channel
        self.cgroup = child.cgroup
        self.own_code_only = True
        self.ran_candidate = False
        self.brought = set()

    def _bound(self) -> tuple[str, ...]:
        return tuple(str(f) for f in (self.draws, self.outbox) if f is not None)

    def _spawn(self, spare: bool = False) -> Started:
        chosen = isolation.chosen()
        tmp = scratch.make("sandbox")
        stderr = open(tmp / "stderr.log", "wb")  # noqa: SIM115 - lives as long as the child
        writable = (*self.writable, *((str(self.outbox),) if self.outbox is not None else ()))
        for hook in ("KB_EXEC_LOG", "KB_INJECT_OOM"):  # the tests' count of executions; injected OOMs
            if path := os.environ.get(hook):
                Path(path).touch()
                writable = (*writable, path)
        argv = [sys.executable, "-m", "kernelbrain.child"]
        readable = (*self.readable, *((str(self.draws),) if self.draws is not None else ()))
        if chosen == "bwrap":  # the compiled kernels every child reads, read-only
            triton_cache.SHARED.mkdir(parents=True, exist_ok=True)
            readable = (*readable, str(triton_cache.SHARED))
        command = isolation.wrap(chosen, argv, tmp, self.device, writable, readable)
        limit = limits.of(tmp)
        cgroup = limits.make_cgroup(limit) if limit is not None else None

        def preexec() -> None:
            child_limits()
            if cgroup is not None:
                limits.enter_cgroup(cgroup)

        channel, theirs = descriptors.pair()
        env = {**self._env(tmp, chosen, spare), descriptors.ENV: str(theirs)}
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=tmp,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,
                pass_fds=(theirs,),
            )
        except BaseException:
            channel.close()
            limits.remove_cgroup(cgroup)
            raise
        finally:
            os.close(theirs)
        if cgroup is not None and not limits.holds(cgroup, proc.pid):  # refused: RLIMIT_DATA alone holds
            limits.remove_cgroup(cgroup)
            cgroup = None
        proc = device_room.counted(proc, self.device, self.gpu)  # its CUDA context, while it lives
        return Started(proc, stderr, tmp, chosen, self._bound(), channel, cgroup)

    def start_spare(self) -> None:
        """Start the next child now, while the worker does other things (a torch import: seconds), where
        the caller expects another candidate from outside (`call`'s `spare`): else it would go unused."""
        if self.spare is None and self.spares:
            self.spare = self._spawn(spare=True)

    def call(
        self,
        request: Request[R],
        *,
        timeout_s: float,
        task: str = "-",
        own_code: bool = False,
        need: device_room.Need | None = None,
        spare: bool = True,
    ) -> tuple[R, float]:
        """Run one request; returns (its reply, busy seconds). Raises SandboxFault when the child dies or
        the candidate failed a check, SandboxError when kb's own code failed in the child. A gate runs
        across two children (runtime/gate.py), a bench times the reference alone after it
        (runtime/reference_retiming.py). `own_code`: its candidates are kb's own template code. It holds
        its device's lock, alone where it times (`last_hold` says when), after reserving `need` where it
        prepares there or gates (runtime/device_room.py). `spare`: a request may run a candidate from
        outside after it (its child is started now)."""
        self.spares, self.times = spare, not isinstance(request, GateRequest)
        device = gpu_lock.device_name(self.device, self.gpu)
        try:
            alone = isinstance(request, TIMED) and not isinstance(request, PREPARED)
            room = need if isinstance(request, (*PREPARED, GateRequest)) else None
            # held for its marked device work: a gate's (runtime/gate.py), a profile's of kb's own code
            # (ncu's start held it 20 s a profile); code from outside might not mark its device work
            lazy = isinstance(request, GateRequest) or (own_code and isinstance(request, PREPARED[2:]))
            with device_room.on_device(device, room, alone=alone, lazy=lazy) as hold:
                self.last_hold = self.hold = hold
                try:
                    reply, busy = self._dispatch(request, timeout_s=timeout_s, task=task, own_code=own_code)
                finally:
                    self.hold = None
                    self._stop_untrusted(request, own_code)  # its memory goes before the room is let go
        finally:
            if self.untrusted(request, own_code):
                self._stop_untrusted(request, own_code)  # where the room or the lock raised
                self.start_spare()  # where the request failed before its child was taken
        return request.parse_reply(reply), busy

    def _stop_untrusted(self, request: Request[Any], own_code: bool) -> None:
        """Stop the child a request ran a candidate from outside in (also where kb's side raised)."""
        if self.untrusted(request, own_code):
            self.recycle_due = self.recycle_due or self.proc is not None
            self.recycle()

    def _dispatch(
        self, request: Request[Any], *, timeout_s: float, task: str, own_code: bool
    ) -> tuple[Message, float]:
        self.make_room(request, own_code)
        # their checked calls' outputs go to the judge, in the outbox (a duel's: a candidate from outside's)
        if isinstance(request, BenchRequest) or (isinstance(request, DuelRequest) and not own_code):
            self.start_judge()
            if self.proc is not None and str(self.outbox) not in self.bound:
                self.stop()  # started before the judge: it cannot write there
        if isinstance(request, GateRequest):
            return gate.gate(self, request, timeout_s=timeout_s, task=task, own_code=own_code)
        if sources := _sources(request):
            self.bring_compiled(sources)
        if isinstance(request, BenchRequest):
            bench = reference_retiming.bench(self, request, timeout_s=timeout_s, task=task, own_code=own_code)
            if own_code and self.own_code_only:  # what the rung's shapes compiled
                self.share_compiled()
            return bench
        if isinstance(request, DuelRequest):
            return reference_retiming.duel(self, request, timeout_s=timeout_s, task=task, own_code=own_code)
        return self.ask(request, timeout_s=timeout_s, task=task, own_code=own_code)

    def untrusted(self, request: Request[Any], own_code: bool) -> bool:
        """Whether `request` runs a candidate from outside in a child of its own (stopped after it)."""
        return self.fresh_untrusted and not own_code and _runs_candidate(request)

    def make_room(self, request: Request[Any], own_code: bool) -> None:
        """Stop a child that ran a candidate where `request` runs one from outside: it gets a fresh one."""
        if self.untrusted(request, own_code) and self.ran_candidate:
            self.stop()

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
        self.judge.start(lazy=self.hold is not None and self.hold.lazy)
        return self.judge

    def gate_folders(self) -> tuple[Path, Path]:
        """The judge's draws and the trial's outbox (made by `start_judge`)."""
        if self.draws is None or self.outbox is None:
            raise RuntimeError("the gate's folders are made by start_judge(), which has not run")
        return self.draws, self.outbox

    def recycle(self, keep_cache: Path | None = None) -> None:
        """Stop the child if a reply asked for a fresh one (or it ran a candidate from outside).
        `keep_cache`: where its Triton cache is moved first, for the caller to keep what a passing trial
        compiled."""
        if self.recycle_due:
            self.recycle_due = False
            cache = self.own_cache()
            if self.proc is not None:
                end_process(self.proc, self.stderr)  # first: nothing of the candidate writes its cache after
                self.proc = None
            if keep_cache is not None and cache is not None and cache.is_dir():
                with contextlib.suppress(OSError):
                    cache.rename(keep_cache)
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
        untrusted = self.untrusted(request, own_code)
        if untrusted and self.ran_candidate:  # kept from an earlier request: make_room() missed
            self.stop()
        if self.proc is None:
            self.start()
        if untrusted:  # the next candidate from outside's child imports while this one works
            self.start_spare()
        if _runs_candidate(request):
            self.ran_candidate = True
            if not own_code:
                self.own_code_only = False  # until this process ends
        assert self.proc and self.proc.stdin and self.proc.stdout and self.stderr
        self.stderr_mark = self.stderr.tell()
        if isinstance(request, READS_OUTPUTS):
            self._hand_incoming()
        if self.judge is not None and _runs_candidate(request):  # what an earlier candidate gave: not read
            descriptors.close_all(self.judge.incoming)
            self.judge.incoming = []
        frame = orjson.dumps({"task": task, "request": request.model_dump(mode="json")})
        try:
            self.proc.stdin.write(HEADER.pack(len(frame)) + frame)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._death() from None
        self.executions += 1
        self.marks, self.pending = [], b""
        marked = 0
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                document, when = self._read(deadline, timeout_s)
                if not (isinstance(document, dict) and document.keys() == {"mark"}):
                    break
                marked += 1  # answered ones too: the answers fill its stdin
                if marked > MAX_MARKS:
                    raise self._fault("crash", f"the child sent over {MAX_MARKS} marks")
                if document["mark"] in ("ready", "device", "/device"):
                    deadline += self._answer(document["mark"])
                    continue
                if self.hold is not None and not self.hold.alone:
                    raise self._fault("policy", "the child timed a batch before it was ready (not kb's code)")
                self.marks.append((str(document["mark"]), when))
            reply = Reply.model_validate(document)
            result = None if reply.result is None else request.parse_reply(reply.result)
        except ValidationError:
            raise self._fault(
                "crash", "the child sent a malformed reply (candidate code wrote to the protocol pipe)"
            ) from None
        finally:
            self._pass_given()
        if why := limits.over_folder(self.tmp):  # its folder past the cap: stopped, the folder removed
            raise self._fault("policy", why)
        if reply.recycle or untrusted:  # a tainted child, or one a candidate from outside ran in
            self.recycle_due = True
            if not hold:
                self.recycle()
        if reply.failure is not None and reply.failure.fault == "candidate":  # the child lives on
            raise SandboxFault(reply.failure.category or "runtime", reply.failure.detail)
        if reply.failure is not None and reply.failure.fault == "memory":
            raise DeviceBusy(reply.failure.detail)
        if reply.failure is not None or result is None:
            detail = reply.failure.detail if reply.failure else "no result"
            trace = reply.failure.trace if reply.failure else ""
            raise SandboxError(f"{request.op} failed inside the sandbox: {detail}\n{trace or ''}")
        return result, reply.busy_s

    def _hand_incoming(self) -> None:
        """Send this child the descriptors waiting for it (a judge: the outputs it is about to read)."""
        waiting, self.incoming = self.incoming, []
        try:
            if self.channel is not None:
                for name, fd in waiting:
                    descriptors.send(self.channel, name, fd)
        except OSError:
            pass  # the child is gone or flooded: a descriptor it asks for is missing, and it says so
        finally:
            descriptors.close_all(waiting)

    def _pass_given(self) -> None:
        """What the child gave during its request, to the judge's next request (closed where none)."""
        if self.channel is not None:
            self.given += descriptors.drain(self.channel)
        given, self.given = self.given, []
        if self.judge is not None:
            self.judge.incoming += given
        else:
            descriptors.close_all(given)

    def _answer(self, label: str) -> float:
        """A mark the worker answers (child/marks.py), then tells the child to go on: `ready`, it is ready
        to time (the call's hold goes alone); `device`, its work reaches the device (a lazy hold is taken).
        `/device`: it left the device (a lazy hold is let go; a pinned one holds). The seconds the child
        waited, which its deadline does not count."""
        if label == "/device":
            if self.hold is not None:
                self.hold.let_go()
            return 0.0
        if label == "ready" and self.hold is not None and self.hold.lazy and not self.times:  # a gate
            raise self._fault("policy", "the child marked itself ready to time in a gate (not kb's code)")
        t0 = time.monotonic()
        if self.hold is not None:
            (self.hold.go_alone if label == "ready" else self.hold.take)()
        assert self.proc and self.proc.stdin
        try:
            self.proc.stdin.write(HEADER.pack(len(GO)) + GO)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._death() from None
        return time.monotonic() - t0

    def _read(self, deadline: float, timeout_s: float) -> tuple[object, float]:
        """The child's next frame, as the JSON document it holds, and this worker's monotonic clock when
        its last byte came in (a batch mark's time: child/marks.py). Descriptors the child gives meanwhile
        are collected, so that its end of their socket never fills."""
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
        closed = False
        while True:
            if len(self.pending) >= HEADER.size:
                size = HEADER.unpack(self.pending[: HEADER.size])[0]
                if size > MAX_REPLY:
                    raise self._fault(
                        "crash", f"the child announced a {size}-byte reply: the protocol was corrupted"
                    )
                need = HEADER.size + size
                if len(self.pending) >= need:
                    frame, self.pending = self.pending[HEADER.size : need], self.pending[need:]
                    try:
                        return orjson.loads(frame), self.pending_at
                    except orjson.JSONDecodeError as e:
                        raise self._fault("crash", f"the child sent a malformed reply: {e}") from None
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fault("timeout", f"no answer within {timeout_s:g} s; the child was killed")
            watched = [fd] if self.channel is None or closed else [fd, self.channel.fileno()]
            ready, _, _ = select.select(watched, [], [], min(left, 1.0))
            if self.channel is not None and self.channel.fileno() in ready:
                came = descriptors.drain(self.channel)
                closed = not came  # readable with nothing to read: the child closed its end
                self.given += came
                if len(self.given) > descriptors.MAX_HELD:
                    raise self._fault("crash", f"the child gave over {descriptors.MAX_HELD} descriptors")
            if fd not in ready:
                continue
            chunk = os.read(fd, 1 << 16)
            self.pending_at = time.monotonic()
            if not chunk:
                raise self._death()
            self.pending += chunk

    def _death(self) -> SandboxFault:
        """The fault of a child that died mid-request: past its memory cap (the candidate's `runtime`
        fault, as a MemoryError under the rlimit is), else a crash."""
        assert self.proc
        detail = died(self.proc, self.isolation or "none", self.stderr, self.stderr_mark)  # waits for it
        if not limits.oom_killed(self.cgroup):
            return self._fault("crash", detail)
        limit = limits.of(self.tmp) if self.tmp is not None else None
        cap = f" of {limit.memory_bytes / limits.GIB:g} GiB" if limit and limit.memory_bytes else ""
        why = f"the child used more memory than its sandbox's cap{cap} (cgroup memory.max) and was killed"
        return self._fault("runtime", why)

    def _fault(self, category: GateCategory, detail: str) -> SandboxFault:
        self.stop()
        return SandboxFault(category, detail)

    def close(self) -> None:
        """Stop the child, its spare and its judge, and remove the judge's draws."""
        self.stop()
        if self.spare is not None:
            self.spare.end()
            self.spare = None
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
            end_process(self.proc, self.stderr)
            self.proc = None
        limits.remove_cgroup(self.cgroup)
        self.cgroup = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        descriptors.close_all(self.incoming)
        self.incoming = []
        if self.tmp is not None:
            scratch.remove(self.tmp)
            self.tmp = None
