"""The event catalogue: one pydantic model per event type, each carrying its schema version.

Events are the only source of truth. A model's `TYPE` is the string stored in the log and its
`VERSION` the payload schema; a change to a payload's meaning bumps `VERSION`, and a reader meeting a
type or version it does not know stops with a clear error instead of guessing (Optuna's journal idea:
stable codes, one apply per type).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kernelbrain.core import torch_ops
from kernelbrain.core.accuracy import Accuracy
from kernelbrain.core.graph import Graph
from kernelbrain.store import NewEvent, StoredEvent


class EventError(Exception):
    """An event in the log this kb cannot read."""


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def to_new(
        self, run_id: str, key: str, actor: str, *, subject: str | None = None, stage: int | None = None
    ) -> NewEvent:
        return NewEvent(
            run_id=run_id,
            type=self.TYPE,
            version=self.VERSION,
            key=key,
            payload=self.model_dump(mode="json"),
            actor=actor,
            subject=subject,
            stage=stage,
        )


# --- run lifecycle -------------------------------------------------------------------------------


class RungSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    shapes: Literal["smallest", "primary", "all"]
    repeats: int = Field(ge=1)
    warmup: int = Field(default=1, ge=0)


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    generator: str = "expert"
    device: Literal["cpu", "cuda"] = "cpu"
    seed: int = 0
    max_candidates: int = Field(default=8, ge=1)
    budget_gpu_s: float | None = None
    budget_wall_s: float | None = None
    budget_tokens: int | None = None
    eta: int = Field(default=3, ge=2)
    rungs: tuple[RungSpec, ...]
    policy_version: int = 4
    gate_seeds: int = Field(default=3, ge=1)
    gate_timeout_s: float = 300.0
    analysis_timeout_s: float = 60.0  # the problem's analysis; past it, a hung import is its fault
    bench_timeout_s: float = 600.0
    # the llm generator's settings travel with the run: external `kb worker`s never see the CLI's flags
    # (the API key never does: it is read from the environment only)
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_temperature: float | None = None
    llm_max_tokens: int | None = None
    llm_timeout_s: float | None = None
    llm_concurrency: int | None = None
    allow_torch: tuple[str, ...] = ()  # torch op classes candidates may keep (--allow-torch); () all Triton
    batch: str | None = None  # the batch of `kb run A.py B.py ...` the run is one of, served by one pool
    max_profiles: int | None = Field(default=None, ge=1)  # finalists profiled at most (best first); None: all
    eval_mode: bool = False  # --eval: reference and candidates in eval mode, else as constructed
    strict_fp32: bool = False  # --strict-fp32: contractions held to IEEE float32 (core/accuracy.py)

    @field_validator("allow_torch")
    @classmethod
    def _known_classes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return torch_ops.parse(v)

    def generator_options(self) -> dict[str, Any]:
        if self.generator != "llm":
            return {"allow_torch": self.allow_torch} if self.allow_torch else {}
        return {
            k.removeprefix("llm_"): v
            for k, v in self.model_dump().items()
            if k.startswith("llm_") and v is not None
        }


class RunStarted(Event):
    TYPE = "RunStarted"
    VERSION = 3  # 2: config.batch; 3: config.strict_fp32
    problem_path: str
    problem_name: str
    problem_hash: str  # blob hash of the problem source
    config: RunConfig
    hardware: dict[str, Any]
    versions: dict[str, str]


class RunResumed(Event):
    TYPE = "RunResumed"
    attempt: int
    hardware: dict[str, Any]


class RunFinished(Event):
    TYPE = "RunFinished"
    basis: int  # seq of the last event the scheduler had seen, where it decided: replay redecides there
    reason: str
    winner: str | None
    winner_rung: int | None
    winner_score: float | None
    note: str = ""  # what a noise adjudication between the best two decided, when one did


# --- generation ----------------------------------------------------------------------------------


class ProblemAnalysed(Event):
    TYPE = "ProblemAnalysed"
    VERSION = 5  # 2: footprint, device_memory; 3: gate_footprint; 4: profile_footprint; 5: accuracy
    ops: list[dict[str, Any]]  # torch calls seen running the reference: {"op": name, ...details}
    families: list[str]  # template families that match
    flops: float  # of the reference at the primary shape
    bytes: float  # minimum bytes moved (inputs + outputs) at the primary shape
    shapes: list[str]  # labels of the problem's shapes, primary first
    signature: dict[str, list[str]] = {}  # Model's init/forward names; init's params as declared (newer)
    error: str | None = None  # set when the problem could not be loaded or traced
    traced_on: str = ""  # "meta": traced from shapes alone, no GPU time; else the device it ran on
    rung_shapes: list[str] = []  # the shapes the rungs time on the run's device (newer): on CPU, one
    primary_ops: list[dict[str, Any]] = []  # ops at the file's primary shape where rungs time another (newer)
    fits: list[dict[str, Any]] = []  # shapes fitted to a byte budget, checked on the reference (newer)
    graph: Graph | None = None  # the ATen graph at the traced shape, sizes marked (newer; None: not captured)
    footprint: float = 0.0  # bytes a timed task needs at its largest rung shape, estimated (0: unknown)
    gate_footprint: float = 0.0  # bytes a gate needs at the gate's shapes, estimated (0: unknown)
    profile_footprint: float = 0.0  # bytes a profile needs at the primary shape, estimated (0: unknown)
    device_memory: float = 0.0  # the device memory admission held it up against (bytes; 0: none)
    mode: Literal["training", "eval"] | None = None  # the reference's: as constructed or --eval; None: eval
    accuracy: Accuracy | None = None  # the accuracy regime measured at the primary shape (None: older run)


class GenerationFailed(Event):
    TYPE = "GenerationFailed"
    task: str  # the generation task ("round0", "mutate/<parent>"): retried by the next `kb resume`
    error: str  # one line: why the generator's service could not be had (refused, 5xx, hung, garbage)


class ProblemFailed(Event):
    TYPE = "ProblemFailed"
    stage: str  # where the problem's own code failed after its analysis: "gate" (the judge's draws)
    error: str  # one line: what failed; no candidate is charged, and the run ends as the problem's fault


# generators whose candidates are kb's own template code, never text from outside: what their children
# compile may be shared with every child (runtime/triton_cache.py)
OWN_CODE_GENERATORS = frozenset({"expert"})


class Launch(BaseModel):
    """One launch of a candidate's plan (templates/compose): the family that renders it, the stage it is
    (a prelude making the head's input, the head, a tail after it), its knobs, and the tensors it reads
    and writes as the candidate's forward names them ("self.<name>": a parameter or buffer of Model's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    stage: Literal["prelude", "head", "tail"]  # making the head's input, the head, or after it
    family: str  # the template family that renders it ("torch": a partial kernel's PyTorch ops)
    knobs: dict[str, Any]  # the knob set it runs at
    reads: list[str]  # the tensors it reads, as forward names them
    writes: str  # the name forward gives its value (the last launch's is returned)


class CandidateProposed(Event):
    TYPE = "CandidateProposed"
    candidate: str  # hash of the source
    source: str  # blob hash
    parent: str | None
    generator: str
    family: str
    strategy: str
    knobs: dict[str, Any]
    round: int
    hint: str  # the strategy axis or diagnosis this candidate answers
    diagnosis: list[str] = []  # profiler labels of the parent that motivated it
    prompt: str | None = None  # blob hash (llm generator)
    reply: str | None = None  # blob hash (llm generator)
    # the gate admits exactly these classes' ATen ops (core/torch_ops.py) beside its Triton kernels
    torch_ops: list[str] = []  # classes of torch ops it keeps in PyTorch, within --allow-torch; [] all Triton
    plan: list[Launch] = []  # its launches in order (expert generator, newer); [] not recorded

    @property
    def own_code(self) -> bool:
        return self.generator in OWN_CODE_GENERATORS


class GenerationDone(Event):
    """A generation task finished: what it proposed and what it skipped as already known."""

    TYPE = "GenerationDone"
    task: str
    proposed: list[str]
    duplicates: int
    note: str = ""


# --- evaluation ----------------------------------------------------------------------------------

GateCategory = Literal["compile", "signature", "runtime", "mismatch", "nan", "timeout", "crash", "policy"]


class GatePassed(Event):
    TYPE = "GatePassed"
    candidate: str
    seeds: int
    max_abs_err: float
    max_rel_err: float
    tolerance: float
    shapes: list[str] = []  # the shapes the gate checked (newer): the file's, or fitted to a byte budget


class GateFailed(Event):
    TYPE = "GateFailed"
    candidate: str
    category: GateCategory
    detail: str
    max_abs_err: float | None = None
    max_rel_err: float | None = None


class ShapeTiming(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    shape: str
    cand_median_s: float
    cand_iqr_s: float
    ref_median_s: float
    ref_iqr_s: float
    repeats: int
    speedup: float
    compile_s: float = 0.0
    calls: int = 1  # calls per timed sample (short kernels are timed in batches; medians are per call)
    ref_alone_median_s: float | None = None  # the reference alone, where no candidate ran (None: older)
    wall_speedup: float | None = None  # the speedup on the worker's own clock (None: older)


class RungBenchmarked(Event):
    TYPE = "RungBenchmarked"
    candidate: str
    rung: int
    shapes: list[ShapeTiming]
    score: float
    timer: str  # "cuda-events" or "interpreter-wallclock"


class BenchmarkFailed(Event):
    """A gate-passing candidate that faulted on the ladder (a larger shape, a timeout)."""

    TYPE = "BenchmarkFailed"
    candidate: str
    rung: int
    category: GateCategory
    detail: str


class ProfileCaptured(Event):
    TYPE = "ProfileCaptured"
    candidate: str
    source: Literal["ncu", "roofline"]
    metrics: dict[str, float]
    labels: list[str]
    report: str | None = None  # blob hash of the raw profiler output
    note: str = ""  # why ncu did not stand behind it, when the roofline does


# --- leases and budget ---------------------------------------------------------------------------


class TaskClaimed(Event):
    TYPE = "TaskClaimed"
    task: str
    worker: str
    token: int
    deadline: float


class LeaseExpired(Event):
    TYPE = "LeaseExpired"
    task: str
    worker: str  # the previous holder
    token: int  # its (now stale) fencing token
    deadline: float
    taken_by: str


class TaskFaulted(Event):
    """kb's own code raised in a worker's task: recorded, then the worker dies and is restarted."""

    TYPE = "TaskFaulted"
    task: str  # lease name
    worker: str  # owner id of the worker that raised
    error: str  # one line: the exception


class TaskParked(Event):
    """A task its workers died or raised on MAX_TASK_FAULTS times this session, set aside so the rest of
    the run goes on; the next `kb resume` tries it again."""

    TYPE = "TaskParked"
    task: str  # lease name
    role: str  # the role whose task it is
    kind: str = ""  # a generation task's "round0" or "mutate/<parent>"
    candidate: str | None = None  # a gate, rung, duel or profile task's candidate
    rung: int | None = None  # a rung or duel task's rung (a profile's: the top rung)
    rival: str | None = None  # a duel's second candidate
    faults: int  # deaths (LeaseExpired) and raises (TaskFaulted) on it this session
    error: str  # the last of them, one line


class BudgetCharged(Event):
    TYPE = "BudgetCharged"
    VERSION = 4  # 2: the device lock held alone (`device`, `alone_from`, `alone_to`); 3: the waits; 4: held
    action: str  # the task it paid for
    role: str
    gpu_s: float = 0.0
    tokens: int = 0
    wall_s: float = 0.0
    # a task that timed or profiled: which device's lock it held alone and when, so that the log shows
    # each device's timed share and that no two timings overlapped
    device: str | None = None  # the device lock it held alone (a GPU's index, or cpu; None: it timed nothing)
    alone_from: float | None = None  # wall clock (time.time) when it took that lock
    alone_to: float | None = None  # wall clock when it let go
    room_wait_s: float = 0.0  # seconds it waited for its device's memory (runtime/device_room.py)
    lock_wait_s: float = 0.0  # seconds it waited for the device's lock: to take it, and to go alone
    lock_held_s: float = 0.0  # seconds it held the device's lock (a gate: while its work was on the device)


# --- the log itself ------------------------------------------------------------------------------


class RunCopied(Event):
    """The run's earlier events were copied here from another store, in their order; the decisions among
    them record their `basis` as a seq of that store, which `seqs` maps. No work of the run: not counted
    among its events, no time in its wall clock (its `ts` is that of the last event it follows)."""

    TYPE = "RunCopied"
    source: str  # where they came from: a SQLite file's path, or a URL with its password masked
    events: int  # how many of the run's events precede this one (all of them copied)
    seqs: str  # blob hash: a JSON list of those events' seqs at the source, in order


# --- scheduler decisions -------------------------------------------------------------------------


class Promoted(Event):
    TYPE = "Promoted"
    basis: int
    candidate: str
    rung_from: int
    rung_to: int
    rank: int  # 1 = best among peers
    peers: dict[str, float]  # candidate -> score at rung_from: the best of those that had finished it
    n_peers: int  # how many had finished it
    keep: int  # how many of the peers ASHA promotes (top 1/eta, at least 1)
    threshold: float  # score of the last promoted place
    score: float
    note: str = ""  # what a noise adjudication decided, when one did


class AdjudicationRequested(Event):
    """Two candidates' scores are within their measured spread: re-measure them interleaved."""

    TYPE = "AdjudicationRequested"
    basis: int
    rung: int
    a: str  # ranked higher on the rung's scores
    b: str
    a_score: float
    b_score: float
    a_spread: float  # relative IQR of each candidate's times at that rung
    b_spread: float
    why: str  # "promotion boundary" or "winner"


class Adjudicated(Event):
    """The interleaved (A, B, A, B, ...) re-measurement and what it decided."""

    TYPE = "Adjudicated"
    rung: int
    a: str
    b: str
    pairs: int
    ratio_median: float  # time of a / time of b, geometric mean over shapes, per pair
    ratio_q1: float
    ratio_q3: float
    outcome: Literal["a", "b", "tie"]
    timer: str
    detail: str = ""  # why the re-measurement failed (a check either side failed, a side slowed)


class Pruned(Event):
    TYPE = "Pruned"
    basis: int
    candidate: str
    rung: int
    reason: str
    rank: int | None = None
    peers: dict[str, float] = {}
    n_peers: int | None = None
    threshold: float | None = None
    score: float | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        RunStarted,
        RunResumed,
        RunFinished,
        ProblemAnalysed,
        ProblemFailed,
        CandidateProposed,
        GenerationDone,
        GenerationFailed,
        GatePassed,
        GateFailed,
        RungBenchmarked,
        BenchmarkFailed,
        ProfileCaptured,
        TaskClaimed,
        LeaseExpired,
        TaskFaulted,
        TaskParked,
        BudgetCharged,
        Promoted,
        Pruned,
        AdjudicationRequested,
        Adjudicated,
        RunCopied,
    )
}

DECISION_TYPES = ("Promoted", "Pruned", "RunFinished", "AdjudicationRequested")


def decode(event: StoredEvent) -> Event:
    """The typed event of a stored one; a type or version this kb does not know is an error naming it."""
    cls = EVENT_TYPES.get(event.type)
    if cls is None:
        raise EventError(
            f"event #{event.seq} has type {event.type!r}, unknown to this kb; upgrade kernelbrain to read it"
        )
    if event.version > cls.VERSION:
        raise EventError(
            f"event #{event.seq} ({event.type}) has schema version {event.version}, newer than this kb's "
            f"{cls.VERSION}; upgrade kernelbrain to read it"
        )
    try:
        return cls.model_validate(event.payload)
    except ValidationError as e:
        first = e.errors()[0]
        raise EventError(
            f"event #{event.seq} ({event.type}) has a malformed payload at "
            f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
        ) from e
