"""The worker's side of a sandboxed child: start it, send it work, survive whatever it does.

Candidate code is untrusted. It runs in its own process and session with a scrubbed environment, its
own temporary directory, no core dumps and capped file sizes, and it dies with its worker
(PR_SET_PDEATHSIG). A hang, a segfault, an illegal memory access or an `os._exit` becomes a
`SandboxFault` with its category; the next call starts a fresh child. A check the candidate fails
inside an op (the child's CandidateFault) is a `SandboxFault` too, with the check's category, and the
child lives on. A warm child is reused until one faults, because importing torch and Triton costs
seconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

import kernelbrain
from kernelbrain.core import handoff
from kernelbrain.core.protocol import (
    HEADER,
    TRITON_SHARED_ENV,
    BenchReply,
    BenchRequest,
    CandidateRequest,
    DrawsReply,
    DrawsRequest,
    DuelRequest,
    GateReply,
    GateRequest,
    JudgeRequest,
    LaunchersRequest,
    NcuRequest,
    ReferenceTimeReply,
    ReferenceTimeRequest,
    Reply,
    Request,
    RooflineRequest,
    TrialReply,
    TrialRequest,
)
from kernelbrain.core.scoring import reference_moved
from kernelbrain.runtime import gpu_lock, isolation, triton_cache
from kernelbrain.runtime.environment import child_env_allowed

# what times or profiles on the GPU: no other request may run there meanwhile (runtime/gpu_lock.py)
TIMED = (BenchRequest, DuelRequest, ReferenceTimeRequest, RooflineRequest, NcuRequest)
# clean timings of the reference taken again where the first makes it look slowed beside a candidate
CLEAN_RETIMES = 2
# the truth (float64 outputs and the reference's own) a judge holds for a problem's next candidates; a
# draw past it is recomputed for each candidate from its inputs' file
JUDGE_KEEP_BYTES = {"cuda": 8 << 30, "cpu": 1 << 30}
MAX_REPLY = 64 << 20  # replies are small JSON documents; more means something else wrote to the pipe


class SandboxFault(Exception):
    """The candidate's fault: its child died (crash, timeout) or it failed a check (mismatch, ...)."""

    def __init__(self, category: str, detail: str) -> None:
        super().__init__(f"{category}: {detail}")
        self.category = category
        self.detail = detail


class SandboxError(Exception):
    """kb's own code failed inside the child (not the candidate's fault)."""


class ProblemFault(SandboxError):
    """The problem's own code raised in the judge, where no candidate code runs: the problem's fault."""


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


def _memory_folder() -> str | None:
    """Where the gate's outputs go: a memory file system where there is one (a trial's outputs at a
    full-size shape are gigabytes, written and read once a candidate), else the temporary folder."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _sources(request: Request) -> list[str]:
    """The candidates a request runs."""
    if isinstance(request, DuelRequest):
        return [request.a_source, request.b_source]
    return [request.cand_source] if isinstance(request, CandidateRequest) else []


def _runs_candidate(request: Request) -> bool:
    return bool(_sources(request)) or isinstance(request, TrialRequest)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Sandbox:
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
        self.proc: subprocess.Popen | None = None
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
        self.tmp = Path(tempfile.mkdtemp(prefix="kb-sandbox-"))
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
        self, request: Request, *, timeout_s: float, task: str = "-", own_code: bool = False
    ) -> tuple[Any, float]:
        """Run one request; returns (its reply, busy seconds). Raises SandboxFault when the child dies or
        the candidate failed a check, SandboxError when kb's own code failed in the child. A gate runs
        across two children (`gate`). `own_code`: its candidates are kb's own template code. On a GPU
        the request holds the GPU's lock: alone where it times or profiles."""
        if self.device != "cuda":
            return self._dispatch(request, timeout_s=timeout_s, task=task, own_code=own_code)
        with gpu_lock.held(gpu_lock.gpu_name(self.gpu), alone=isinstance(request, TIMED)):
            return self._dispatch(request, timeout_s=timeout_s, task=task, own_code=own_code)

    def _dispatch(
        self, request: Request, *, timeout_s: float, task: str, own_code: bool
    ) -> tuple[Any, float]:
        if isinstance(request, GateRequest):
            return self.gate(request, timeout_s=timeout_s, task=task, own_code=own_code)
        if sources := _sources(request):
            self._bring_compiled(sources)
        if isinstance(request, BenchRequest):
            reply = self.bench(request, timeout_s=timeout_s, task=task, own_code=own_code)
            if own_code and self.own_code_only:  # what the rung's shapes compiled
                self._share_compiled()
            return reply
        return self._call(request, timeout_s=timeout_s, task=task, own_code=own_code)

    def bench(
        self, request: BenchRequest, *, timeout_s: float, task: str = "-", own_code: bool = False
    ) -> tuple[BenchReply, float]:
        """A rung timed beside the reference (the ratio is measured side by side, in one process), then
        the reference alone in the judge's child, where no candidate code ever ran: a reference that ran
        slower beside the candidate than there, past noise, was slowed by it (`policy`), however it was
        done (a patch that restores itself before the checks, one below Python)."""
        # the judge imports while the rung is timed: a run killed before its first bench, or a
        # benchmarker with nothing to time, never starts one
        self.start_judge()
        timed, busy = self._call(request, timeout_s=timeout_s, task=task, own_code=own_code)
        assert isinstance(timed, BenchReply)
        busy_alone = 0.0
        clean: list[tuple[float, float]] = []  # per shape: the slowest clean time so far, and its IQR
        # the reference's time alone, timed again (up to CLEAN_RETIMES times) while it looks moved: a
        # reference of microseconds varies by 2x between clean timings, and only the slowest of them is
        # evidence against the candidate
        for attempt in range(1 + CLEAN_RETIMES):
            try:
                alone, spent = self._alone(request, timed, timeout_s, task, fresh=attempt > 0)
            except SandboxFault as e:
                raise SandboxError(f"the judge's child failed timing the reference alone: {e}") from None
            busy_alone += spent
            timings = list(zip(alone.medians_s, alone.iqrs_s, strict=True))
            if clean:  # the slower of each shape's clean times
                timings = [t if t[0] > c[0] else c for c, t in zip(clean, timings, strict=True)]
            clean = timings
            moved = [
                reference_moved(s.ref_median_s, s.ref_iqr_s, median, iqr, request.device)
                for s, (median, iqr) in zip(timed.shapes, clean, strict=True)
            ]
            if all(m is None for m in moved):
                break
        self.bench_phases = {"bench": busy, "alone": busy_alone, "clean_timings": attempt + 1}
        self.bench_phases.update({f"bench.{k}": v for k, v in timed.steps.items()})
        for s, (median, _), m in zip(timed.shapes, clean, moved, strict=True):
            if m is not None:
                raise SandboxFault(
                    "policy",
                    f"benchmark shape {s.shape}: the reference ran {m:.2f}x slower beside the candidate "
                    f"({s.ref_median_s:.3g} s) than in a process where no candidate ran ({median:.3g} s, the "
                    f"slowest of {attempt + 1} timings there): the candidate slowed the reference it is "
                    "timed against",
                )
        shapes = [
            s.model_copy(update={"ref_alone_median_s": c[0]})
            for s, c in zip(timed.shapes, clean, strict=True)
        ]
        return timed.model_copy(update={"shapes": shapes}), busy + busy_alone

    def gate(
        self, request: GateRequest, *, timeout_s: float, task: str = "-", own_code: bool = False
    ) -> tuple[GateReply, float]:
        """V(p) across two children. The judge (its own sandbox, where no candidate code ever runs) draws
        the inputs into a folder this child sees read-only, and keeps the truth; this child runs the
        candidate on them and writes its outputs; the judge compares them. The candidate's process never
        holds the reference nor an expected output. A fault of the judge's (the problem's reference) is
        kb's side, not the candidate's. What a passing trial compiled is kept for the children that time
        it, and shared with every child where the trial's process ran only kb's own code."""
        started = time.perf_counter()
        self.start_judge()
        assert self.judge is not None
        problem = {"problem_source": request.problem_source, "device": request.device, "seeds": request.seeds}
        problem["fits"] = request.fits
        problem["folder"] = str(self.draws)
        keep = JUDGE_KEEP_BYTES.get(request.device, 0)
        try:
            drawn, busy = self.judge._call(
                DrawsRequest(**problem, keep_bytes=keep), timeout_s=timeout_s, task=task
            )
        except (SandboxFault, SandboxError) as e:  # the draws run the problem's code, no candidate's
            raise ProblemFault(f"the gate's judge failed drawing the problem's inputs: {e}") from None
        assert isinstance(drawn, DrawsReply)
        self.gate_phases = {"draws": busy}
        if self.proc is not None and str(self.outbox) not in self.bound:
            self._stop()  # started before the judge: it cannot see the draws
        self._bring_compiled([])  # what this child's cache holds after the trial is this candidate's
        assert self.outbox is not None
        for left in self.outbox.iterdir():  # an earlier candidate's (the folder stays: it is bound)
            if left.is_dir() and not left.is_symlink():
                shutil.rmtree(left)
            else:
                left.unlink()
        trial, busy_trial = self._call(
            TrialRequest(
                cand_source=request.cand_source,
                device=request.device,
                folder=str(self.draws),
                outbox=str(self.outbox),
                prints=drawn.prints,
                keep_bytes=keep,
                shapes=drawn.shapes,
                signature=drawn.signature,
                forbidden=drawn.forbidden,
                seeds=request.seeds,
                torch_ops=request.torch_ops,
            ),
            timeout_s=timeout_s,
            task=task,
            hold=True,
            own_code=own_code,
        )
        assert isinstance(trial, TrialReply)
        self.gate_phases["trial"] = busy_trial
        self.gate_phases.update({f"trial.{k}": v for k, v in trial.steps.items()})
        if not (own_code and self.own_code_only):  # else the trial's own launchers are shared (below)
            busy_trial += self._launchers_built(trial.launchers, timeout_s, task)
        try:
            handed = self._handed(trial, len(drawn.shapes), request.seeds)
        finally:
            self.recycle()  # a candidate that left a thread or replaced torch: the next gets a fresh child
        if handed is None:
            return GateReply(passed=False, category=trial.category, detail=trial.detail), busy + busy_trial
        verdict, busy_judge = self.judge._call(
            JudgeRequest(**problem, outputs_dir=str(handed)), timeout_s=timeout_s, task=task
        )
        self.gate_phases.update(judge=busy_judge)
        if verdict.passed:
            self._keep_compiled(request.cand_source)
            if own_code and self.own_code_only:
                self._share_compiled()
        self.gate_phases["wall"] = time.perf_counter() - started
        return verdict, busy + busy_trial + busy_judge

    def _handed(self, trial: TrialReply, shapes: int, seeds: int) -> Path | None:
        """The outbox, where the trial wrote its outputs for the judge (a folder the judge reads, no copy);
        None where the trial failed a check."""
        if trial.folder is None:
            return None
        assert self.outbox is not None
        if Path(trial.folder) != self.outbox:
            raise SandboxFault("runtime", f"its outputs were not written in the outbox ({trial.folder})")
        for shape in range(shapes):
            for seed in range(seeds):
                data = handoff.outputs_file(self.outbox, shape, seed)
                for f in (data, handoff.header_of(data)):
                    if f.is_symlink() or not f.is_file():
                        raise SandboxFault("runtime", f"it wrote no outputs file {f.name}")
        return self.outbox

    def _launchers_built(self, signatures: list[list[Any]], timeout_s: float, task: str) -> float:
        """The judge builds Triton's launchers for a trial's kernel signatures, and they are kept for the
        children after (under bubblewrap: the other levels share the host's cache); its busy seconds."""
        keyed = {orjson.dumps(s).decode(): s for s in signatures}
        new = {k: s for k, s in keyed.items() if k not in self.built}
        if not new or self._own_cache() is None or self.judge is None:
            return 0.0
        self.built.update(new)
        try:
            request = LaunchersRequest(signatures=list(new.values()))
            _, busy = self.judge._call(request, timeout_s=timeout_s, task=task)
        except (SandboxFault, SandboxError):  # an optimisation only: the next candidate builds its own
            return 0.0
        judge_cache = self.judge._own_cache()
        if judge_cache is not None:
            triton_cache.keep_launchers(judge_cache)
        self.gate_phases["launchers"] = busy
        return busy

    def _own_cache(self) -> Path | None:
        """This child's own Triton cache, where it has one (bubblewrap; the others share the host's)."""
        return self.tmp / "triton" if self.isolation == "bwrap" and self.tmp is not None else None

    def _bring_compiled(self, sources: list[str]) -> None:
        """Start the child, empty its Triton cache of whatever an earlier candidate left there, and fill it
        with what the gate compiled for these candidates: their kernels load rather than compile."""
        self.start()
        cache = self._own_cache()
        if cache is None:
            return
        triton_cache.fill(cache, sources)
        self.brought = {e.name for e in cache.iterdir()}

    def _share_compiled(self) -> None:
        """What this child compiled in its last request (not what was brought to it: the children that
        compiled that may have run code from outside), for every child."""
        cache = self._own_cache()
        if cache is not None:
            triton_cache.share(cache, self.brought)

    def _keep_compiled(self, source: str) -> None:
        """What this child's Triton cache holds after a passing trial (emptied before it): the candidate's
        compiled kernels, kept once for the children that time it."""
        cache = self._own_cache()
        if cache is not None:
            triton_cache.keep_compiled(cache, source)

    def _alone(
        self, request: BenchRequest, timed: BenchReply, timeout_s: float, task: str, fresh: bool = False
    ) -> tuple[ReferenceTimeReply, float]:
        assert self.judge is not None
        alone, busy = self.judge._call(
            ReferenceTimeRequest(
                problem_source=request.problem_source,
                device=request.device,
                fits=request.fits,
                which=request.which,
                calls=[s.calls for s in timed.shapes],
                repeats=request.repeats,
                warmup=request.warmup,
                fresh=fresh,
            ),
            timeout_s=timeout_s,
            task=task,
        )
        assert isinstance(alone, ReferenceTimeReply)
        return alone, busy

    def start_judge(self) -> None:
        """Start the gate's judge ahead of a first gate (a torch import, a CUDA context), and the folder
        of its draws."""
        if self.draws is None or self.outbox is None:
            self.draws = Path(tempfile.mkdtemp(prefix="kb-draws-"))
            self.outbox = Path(tempfile.mkdtemp(prefix="kb-outbox-", dir=_memory_folder()))
        if self.judge is None:
            self.judge = Sandbox(
                self.device,
                gpu=self.gpu,
                warm_cuda=self.warm_cuda,
                writable=(*self.writable, str(self.draws)),
                readable=(str(self.outbox),),
            )
        self.judge.start()

    def recycle(self) -> None:
        """Stop the child if a reply asked for a fresh one."""
        if self.recycle_due:
            self.recycle_due = False
            self._stop()

    def _call(
        self,
        request: Request,
        *,
        timeout_s: float,
        task: str = "-",
        hold: bool = False,
        own_code: bool = False,
    ) -> tuple[Any, float]:
        """One request to this child. `hold`: a reply that asks for a fresh child leaves this one (and
        its folder) until `recycle()`, so that its files can be read first. `own_code`: the candidates it
        runs are kb's own template code."""
        if self.proc is not None and self.proc.poll() is not None:
            # it died after its last answer (a stray thread of an earlier candidate): not this one's fault
            self._stop()
        if self.proc is None:
            self.start()
        if _runs_candidate(request) and not own_code:
            self.own_code_only = False  # until this process ends
        assert self.proc and self.proc.stdin and self.proc.stdout
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
            result = None if reply.result is None else request.reply.model_validate(reply.result)
        except ValidationError:
            raise self._fault(
                "crash", "the child sent a malformed reply (candidate code wrote to the protocol pipe)"
            ) from None
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

    def _read(self, deadline: float, timeout_s: float) -> Any:
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

    def _fault(self, category: str, detail: str) -> SandboxFault:
        self._stop()
        return SandboxFault(category, detail)

    def close(self) -> None:
        """Stop the child and its judge, and remove the judge's draws."""
        self._stop()
        if self.judge is not None:
            self.judge.close()
            self.judge = None
        for folder in (self.draws, self.outbox):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        self.draws = self.outbox = None

    def _stop(self) -> None:
        """Stop the child (after a fault, or to recycle it); a judge lives on: no candidate ran there."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=5)
            for f in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(Exception):
                    f.close()
            self.stderr.close()
            self.proc = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
