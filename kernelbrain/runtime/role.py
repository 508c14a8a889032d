"""What every worker role shares: its task, its identity as a lease owner, its sandbox children, and the
one path by which a role asks a child for work and records what that cost (`consult`, `with_charge`)."""

from __future__ import annotations

import abc
import socket
import time
from dataclasses import dataclass
from typing import Generic, TypeVar

from kernelbrain.core.accuracy import Accuracy
from kernelbrain.core.events import BudgetCharged, Event, GateCategory, ProblemFailed
from kernelbrain.core.problem import in_eval_mode
from kernelbrain.core.protocol import Fit, Message, Request
from kernelbrain.core.state import RunState
from kernelbrain.runtime import device_room, gpu_lock, processes
from kernelbrain.runtime.device_room import Need
from kernelbrain.runtime.gpu_lock import Hold
from kernelbrain.runtime.sandbox import ProblemFault, Sandbox, SandboxError, SandboxFault
from kernelbrain.store import NewEvent, Store

R = TypeVar("R", bound=Message)


def owner_id(role: str) -> str:
    pid, start = processes.me()
    return f"{role}@{socket.gethostname()}:{pid}:{start}"


def owner_alive(owner: str) -> bool:
    """A lease held by a dead process on this host can be taken before its deadline."""
    try:
        host, pid, start = owner.rsplit("@", 1)[1].rsplit(":", 2)
        number = int(pid)
    except (IndexError, ValueError):
        return True
    if host != socket.gethostname():
        return True  # cannot tell: wait for the deadline
    return processes.alive(number, start)


@dataclass(frozen=True)
class Task:
    key: str  # lease name and idempotency-key prefix
    candidate: str | None = None
    rung: int | None = None
    kind: str = ""  # the generator's: "round0" or "mutate/<parent>"
    rival: str | None = None  # a duel's second candidate (the first is `candidate`)


@dataclass(frozen=True)
class Consulted(Generic[R]):
    """A child's reply to one request, or the fault that stood in for it (exactly one is set), and what
    it cost."""

    reply: R | None
    fault: SandboxFault | SandboxError | None
    busy_s: float  # the child's own busy time (0 when it faulted)
    started: float  # perf_counter when the role began the task
    hold: Hold | None = None  # its hold of the device lock, alone where it timed or profiled, or shared

    @property
    def line(self) -> str:
        """The fault in one line, as events record it."""
        return str(self.fault).splitlines()[0] if self.fault is not None else ""


def problem_need(state: RunState) -> Need | None:
    """The run's problem's memory on its device, as its analysis estimated it (None: not known)."""
    a = state.analysis
    return device_room.need(a.footprint, a.device_memory) if a is not None else None


def profile_need(state: RunState) -> Need | None:
    """What a profile of the run's candidate holds on its device (the primary shape, its inputs once):
    the problem's footprint where the analysis did not count it (None: neither known)."""
    a = state.analysis
    return device_room.need(a.profile_footprint or a.footprint, a.device_memory) if a is not None else None


def gate_need(state: RunState) -> Need | None:
    """What a gate of the run's problem holds on its device, as its analysis estimated it (None: not
    known, as in a run analysed before it was recorded)."""
    a = state.analysis
    return device_room.need(a.gate_footprint, a.device_memory) if a is not None else None


def _last(box: Sandbox | None) -> Hold | None:
    """The hold of the device lock a request just had, alone or shared."""
    return box.last_hold if box is not None else None


class Role(abc.ABC):
    name: str
    uses_sandbox = False
    # its child makes the CUDA context before its first task (the generator's analysis needs none)
    warms_cuda = True
    # on SIGTERM a task in flight is dropped at once rather than finished: nothing of it is recorded yet,
    # and its lease, its owner dead, is taken over when the task is done again (a hung LLM request)
    abandons_on_stop = False
    # it runs candidates' code in its child (the generator runs only the problem's, for the analysis)
    runs_candidates = True

    def __init__(
        self, store: Store, gpu: int | None = None, children: dict[str, Sandbox] | None = None
    ) -> None:
        """`children`: sandboxes shared with the other roles stepped in this process (`kb run --inprocess`),
        one per device, owned by whoever passed them; else this role starts and closes its own."""
        self.store = store
        self.gpu = gpu
        self.shared = children is not None
        self.sandboxes: dict[str, Sandbox] = children if children is not None else {}
        self.actor = owner_id(self.name)

    def wants_warm(self, state: RunState) -> bool:
        """Whether a child is worth starting ahead of a first task (a torch import, a CUDA context)."""
        return self.uses_sandbox

    def sandbox(self, device: str) -> Sandbox:
        """This role's child on `device`. Shared between roles, one child runs the candidates of all of
        them and its judge the requests of a role that runs none (a child no candidate code ran in)."""
        if device not in self.sandboxes:
            warm_cuda = self.warms_cuda or self.shared  # a shared child serves roles that need CUDA
            self.sandboxes[device] = Sandbox(device, gpu=self.gpu, warm_cuda=warm_cuda)
        box = self.sandboxes[device]
        if self.shared and not self.runs_candidates:
            return box.start_judge()
        return box

    # its first task needs the judge's child at once (the gate): started with its own, ahead of it
    warms_judge = False

    def warm(self, device: str) -> None:
        """Start this role's child (and the judge's, first: the child sees its draws) ahead of its first
        task. Shared children start together, at the first role's warm-up: the analysis that follows
        holds up the other roles' turns."""
        self.sandbox(device)
        box = self.sandboxes[device]  # shared: the pair, not the judge the generator is handed
        if self.warms_judge or self.shared:
            box.start_judge()
        box.start()

    def close(self) -> None:
        if not self.shared:  # shared children are closed by their owner
            for sb in self.sandboxes.values():
                sb.close()

    @abc.abstractmethod
    def tasks(self, state: RunState) -> list[Task]: ...

    def fits_now(self, state: RunState) -> bool:
        """Whether the run's tasks for this role would have their device memory at once (a role that
        reserves none: always)."""
        return True

    @abc.abstractmethod
    def execute(self, task: Task, state: RunState) -> list[NewEvent]: ...

    def consult(
        self,
        device: str,
        request: Request[R],
        *,
        timeout_s: float,
        task: str,
        started: float | None = None,
        own_code: bool = False,
        need: Need | None = None,
        spare: bool = True,
    ) -> Consulted[R]:
        """One request to this role's child on `device`; a fault (the candidate's or kb's) is returned,
        not raised, so every role records it and its cost the same way. `own_code`: the request runs
        only kb's own template code (what its child compiles may be shared). `need`: the problem's
        memory, reserved on the device while a rung, a duel or a profile prepares and times there.
        `spare`: another request of this role may run a candidate from outside (`spare_wanted`)."""
        t0 = time.perf_counter() if started is None else started
        box: Sandbox | None = None
        try:
            box = self.sandbox(device)
            box.last_hold = None
            reply, busy = box.call(
                request, timeout_s=timeout_s, task=task, own_code=own_code, need=need, spare=spare
            )
        except (SandboxFault, SandboxError) as e:
            return Consulted(None, e, 0.0, t0, _last(box))
        return Consulted(reply, None, busy, t0, _last(box))

    def cost(self, state: RunState, task: Task, asked: Consulted[R]) -> NewEvent:
        """What a consultation cost: the child's busy seconds, or the wall time where the child died
        before it could say."""
        wall = time.perf_counter() - asked.started
        return self.charge(state, task, gpu_s=asked.busy_s or wall, wall_s=wall, hold=asked.hold)

    def with_charge(self, state: RunState, task: Task, event: Event, asked: Consulted[R]) -> list[NewEvent]:
        """The task's result and its BudgetCharged."""
        return [self.new(state, event, task.key, task), self.cost(state, task, asked)]

    def new(self, state: RunState, event: Event, key: str, task: Task | None = None) -> NewEvent:
        return event.to_new(
            state.run_id,
            key,
            self.actor,
            subject=task.candidate if task else None,
            stage=task.rung if task else None,
        )

    def charge(
        self,
        state: RunState,
        task: Task,
        *,
        gpu_s: float = 0.0,
        wall_s: float = 0.0,
        tokens: int = 0,
        hold: Hold | None = None,
    ) -> NewEvent:
        """The task's BudgetCharged: what `hold`, its hold of the device lock, waited for (memory, the
        lock), how long it held the lock, and where it held the device alone (and let go), when."""
        alone = hold if hold is not None and hold.alone and hold.to else None
        cost = BudgetCharged(
            action=task.key,
            role=self.name,
            gpu_s=gpu_s,
            wall_s=wall_s,
            tokens=tokens,
            device=alone.device if alone else None,
            alone_from=alone.since if alone else None,
            alone_to=alone.to if alone else None,
            room_wait_s=hold.room_s if hold else 0.0,
            lock_wait_s=hold.lock_s if hold else 0.0,
            lock_held_s=hold.held_s if hold else 0.0,
        )
        return self.new(
            state,
            cost,
            f"{task.key}/budget",
            task,
        )

    def problem_source(self, state: RunState) -> str:
        """The problem as the run records it, in eval mode where the run is (RunState.eval_mode)."""
        assert state.started
        source = self.store.get_blob(state.started.problem_hash).decode()
        return in_eval_mode(source) if state.eval_mode else source

    @staticmethod
    def fits(state: RunState) -> list[Fit]:
        """The shapes the run's analysis fitted, handed to every later request on the problem."""
        return [Fit.model_validate(f) for f in state.analysis.fits] if state.analysis is not None else []

    @staticmethod
    def accuracy(state: RunState) -> Accuracy | None:
        """The accuracy regime the run's analysis measured, handed to every later request on the problem."""
        return state.analysis.accuracy if state.analysis is not None else None

    def candidate_source(self, state: RunState, cid: str) -> str:
        return self.store.get_blob(state.candidates[cid].proposal.source).decode()

    @staticmethod
    def torch_classes(state: RunState, cid: str) -> list[str]:
        """The classes of torch ops a candidate's label lets it run, never beyond the run's --allow-torch."""
        return [c for c in state.candidates[cid].proposal.torch_ops if c in state.config.allow_torch]


class CandidateRole(Role, Generic[R]):
    """A role that runs one sandbox request (replied to with an R) on one candidate and records its
    outcome or its fault."""

    uses_sandbox = True

    def timeout_s(self, state: RunState) -> float:
        return state.config.bench_timeout_s

    @abc.abstractmethod
    def request(self, task: Task, state: RunState) -> Request[R]: ...

    @abc.abstractmethod
    def on_result(self, task: Task, result: R) -> Event: ...

    @abc.abstractmethod
    def on_fault(self, task: Task, category: GateCategory, detail: str) -> Event: ...

    def outcome(self, task: Task, asked: Consulted[R]) -> Event:
        if isinstance(asked.fault, SandboxFault):
            return self.on_fault(task, asked.fault.category, asked.fault.detail)
        if asked.reply is None:  # kb's own failure in the child: recorded, so the run moves on
            return self.on_fault(task, "runtime", asked.line)
        return self.on_result(task, asked.reply)

    def need(self, state: RunState) -> Need | None:
        """The device memory this role's request reserves (runtime/device_room.py): the problem's
        footprint, where it prepares and times."""
        return problem_need(state)

    def fits_now(self, state: RunState) -> bool:
        device = gpu_lock.device_name(state.config.device, self.gpu)
        return device_room.fits_now(device, self.need(state))

    def spare_wanted(self, task: Task, state: RunState) -> bool:
        """Whether a request of this role after `task` may run a candidate kb did not write (so a child
        that ran none is worth starting now): a live one other than the task's, whose work is not done."""
        return any(
            c.id != task.candidate and not c.proposal.own_code and c.terminal is None for c in state.live()
        )

    def execute(self, task: Task, state: RunState) -> list[NewEvent]:
        t0 = time.perf_counter()
        asked = self.consult(
            state.config.device,
            self.request(task, state),
            timeout_s=self.timeout_s(state),
            task=task.key,
            started=t0,
            own_code=task.candidate is not None and state.candidates[task.candidate].proposal.own_code,
            need=self.need(state),
            spare=self.spare_wanted(task, state),
        )
        if isinstance(asked.fault, ProblemFault):
            # the problem's own code failed where no candidate code runs: the run ends as the problem's
            # fault, and the cost is the run's, not this candidate's
            stage = task.key.split("/")[1]
            problem = Task(f"{state.run_id}/problem")
            failed = ProblemFailed(stage=stage, error=asked.line)
            return [self.new(state, failed, problem.key), self.cost(state, problem, asked)]
        return self.with_charge(state, task, self.outcome(task, asked), asked)
