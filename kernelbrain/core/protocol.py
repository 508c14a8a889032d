"""The sandbox protocol: one request and one reply model per operation, shared by the child and its
client, and the frame both write (a 4-byte little-endian length, then the orjson document).

A request names its operation in `op` (the discriminator the child dispatches on) and its reply type
as its type parameter (`GateRequest` is a `Request[GateReply]`), so the client validates what comes
back as strictly as the events, and a type checker knows what `Sandbox.call` returns. A reply that
failed carries a `Failure`: whose fault it was (`candidate`: a check the candidate failed, with its
GateFailed category; `kb`: kb's own code raised), never a string to parse.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

from kernelbrain.core.accuracy import Accuracy
from kernelbrain.core.events import GateCategory, ShapeTiming
from kernelbrain.core.graph import Graph

HEADER = struct.Struct("<I")
# the worker's answer to a child's `ready` mark (child/marks.py): the device is held alone, time now
GO = b"go"
# the environment variable that names, to a bubblewrap child, the read-only folder of shared compiled
# kernels behind its own Triton cache (runtime/triton_cache.py keeps it, child/shared_cache.py reads it)
TRITON_SHARED_ENV = "KB_TRITON_SHARED"

Device = Literal["cpu", "cuda", "meta"]
# a kernel's argument types as Triton writes them ("*fp32", "i32", "constexpr"; a tuple nests as a list)
KernelSignature = list[Any]
Which = Literal["smallest", "primary", "all"]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GateReply(Message):
    """V(p)'s verdict. Passed: the seeds checked and the worst errors. Failed: the category and detail,
    with the error figures where the failure was a mismatch."""

    passed: bool
    category: GateCategory | None = None
    detail: str | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    tolerance: float | None = None
    seeds: int | None = None
    shapes: list[str] = []  # the shapes checked (fitted to the gate's budget where the file names none)


class KeptCall(Message):
    """A timed call whose outputs the bench kept for the judge: the ladder shape's index, the call's
    sample, and its inputs' contents as the bench's rotation loaded them (a drawn set and the mix of the
    next set's values, child/timing.py's Rotation)."""

    shape: int
    call: int
    draw: int
    offset: int
    stride: int
    side: str = ""  # a duel's side ("A", "B"); a bench's: ""


class BenchReply(Message):
    shapes: list[ShapeTiming]
    timer: str
    steps: dict[str, float] = {}  # seconds per step, summed over shapes (tools/gate_phases.py)
    kept: list[KeptCall] = []  # the timed calls whose outputs are in the request's outbox, for the judge


class DuelShape(Message):
    """One shape of a duel: each side's median and IQR per call, as timed beside the other."""

    shape: str
    calls: int
    a_median_s: float
    a_iqr_s: float
    b_median_s: float
    b_iqr_s: float


class DuelReply(Message):
    ratios: list[float]  # per interleaved pair: A's time / B's (geometric mean over the rung's shapes)
    timer: str
    shapes: list[DuelShape] = []
    kept: list[KeptCall] = []  # the timed calls whose outputs are in the request's outbox, for the judge


class Signature(Message):
    init: list[str]
    forward: list[str]
    params: list[str] = []  # Model.__init__'s parameters as declared (defaults, kinds), a string each


class Fit(Message):
    """A shape fitted to a byte budget by the run's analysis (kernelbrain/child/shapes.py), where the
    reference could run: the base shape's label, the budget and row floor, the sizes it changed."""

    shape: str
    budget: int
    rows: int
    sizes: dict[str, int]
    note: str = ""  # why it stays over the budget ("runs at the file's own size: ..."; newer)


class AnalyseReply(Message):
    ops: list[dict[str, Any]]
    flops: float
    bytes: float
    shapes: list[str]
    signature: Signature
    traced_on: str  # "meta": the analysis used no GPU time
    rung_shapes: list[str] = []  # what every rung times on this device (on CPU one fitted shape)
    primary_ops: list[dict[str, Any]] = []  # ops at the file's primary shape where the rungs time another
    fits: list[Fit] = []  # the shapes fitted for this device, handed to every later child
    graph: Graph | None = None  # the reference's ATen graph at the traced shape, where it could be captured
    footprint: float = 0.0  # bytes a timed task needs at its largest rung shape (0: unknown)
    gate_footprint: float = 0.0  # bytes a gate needs at its shapes (0: unknown)
    accuracy: Accuracy | None = None  # the regime of the reference's contractions at the primary shape
    profile_footprint: float = 0.0  # bytes a profile needs at the primary shape (0: unknown)
    device_memory: float = 0.0  # bytes one child may hold: the GPU's, or a CPU child's cap
    mode: Literal["training", "eval"] = "eval"  # the mode the reference ran in


class RooflineReply(Message):
    time_s: float
    bytes: float
    flops: float
    arith_intensity: float
    ridge_intensity: float
    dram_frac: float
    compute_frac: float
    floor_frac: float
    bandwidth_Bps: float
    matmul_flops: float


class NcuReply(Message):
    """Nsight Compute's metrics, or why it was not used (`error`)."""

    metrics: dict[str, float] = {}
    kernels: int = 0
    raw: str = ""
    error: str | None = None


ReplyT = TypeVar("ReplyT", bound=Message)


class Request(Message, Generic[ReplyT]):
    """A request whose reply is a ReplyT; `reply` is that type at run time, taken from the parameter."""

    reply: ClassVar[type[Message]]
    op: str  # the operation: each request narrows it to a Literal, the child's discriminator

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for base in cls.__mro__:  # Request[X] itself, or a request class derived from it
            meta = getattr(base, "__pydantic_generic_metadata__", None)
            if meta is not None and meta["origin"] is Request and meta["args"]:
                cls.reply = meta["args"][0]
                return

    def parse_reply(self, value: object) -> ReplyT:
        """`value` (a reply's document, or a reply) validated as this request's reply type."""
        return cast(ReplyT, self.reply.model_validate(value))  # `reply` is ReplyT: set from the parameter


class ProblemRequest(Message):
    """The fields of a request on a problem (a mixin: the request classes below are the Requests)."""

    problem_source: str
    device: Device
    fits: list[Fit] = []  # the run's analysis's (none for the analysis itself, nor for `kb check`)
    accuracy: Accuracy | None = None  # the regime the run's analysis measured (core/accuracy.py)


class CandidateRequest(ProblemRequest):
    cand_source: str


class GateRequest(CandidateRequest, Request[GateReply]):
    op: Literal["gate"] = "gate"
    seeds: int
    torch_ops: list[str] = []  # the classes of torch ops the candidate's label lets it run (core/torch_ops)


class DrawsReply(Message):
    """The judge's draws for a problem's gate, as files the candidate's child reads (kernelbrain.core.
    handoff): per gate shape the init inputs and the reference's weights, per seed the inputs. The truth
    stays in the judge."""

    shapes: list[str]
    signature: Signature
    forbidden: list[list[str]]  # per shape: the torch calls the reference makes (not glue)
    prints: list[list[str]]  # per shape and seed: the digest of the inputs' fingerprints


class TrialReply(Message):
    """The folder where the candidate's child wrote its outputs, a file per shape and seed, for the judge;
    or the check it failed there (no outputs)."""

    folder: str | None = None
    category: GateCategory | None = None
    detail: str | None = None
    steps: dict[str, float] = {}  # seconds per step of a passing trial, for tools/gate_phases.py
    launchers: list[KernelSignature] = []  # the signatures Triton built launchers for (child/launchers.py)


class DrawsRequest(ProblemRequest, Request[DrawsReply]):
    """The judge (a child no candidate code ever runs in): draw the gate's inputs and keep the truth."""

    op: Literal["draws"] = "draws"
    seeds: int
    folder: str  # where the draws' files go: the candidate's child sees it read-only
    keep_bytes: int  # the truth held for the next candidates; past it, recomputed for each


class TrialRequest(Request[TrialReply]):
    """The candidate's child: build ModelNew from the draws, run it on them under watch, write outputs."""

    op: Literal["trial"] = "trial"
    cand_source: str
    device: Device
    folder: str  # the judge's draws
    outbox: str  # where the outputs go, for the judge
    prints: list[list[str]]  # their digests, as the judge drew them
    keep_bytes: int  # the draws this child may hold for a problem's next candidates
    shapes: list[str]
    signature: Signature
    forbidden: list[list[str]]
    seeds: int
    torch_ops: list[str] = []  # the classes of torch ops the candidate may run (core/torch_ops.py)


class JudgeRequest(ProblemRequest, Request[GateReply]):
    """The judge: compare a trial's outputs with the truth it kept for these draws."""

    op: Literal["judge"] = "judge"
    seeds: int
    folder: str  # the draws'
    outputs_dir: str  # the trial's outputs, handed to the judge


class LaunchersReply(Message):
    built: int


class LaunchersRequest(Request[LaunchersReply]):
    """The judge: build Triton's launchers for these kernel signatures, a trial's, into its own cache."""

    op: Literal["launchers"] = "launchers"
    signatures: list[KernelSignature]


class ReferenceTimeReply(Message):
    medians_s: list[float]  # per shape, per call
    iqrs_s: list[float]


class ReferenceTimeRequest(ProblemRequest, Request[ReferenceTimeReply]):
    """The reference alone, in a child no candidate code ever ran in, at a bench's shapes and calls per
    sample: what it costs when nothing can slow it."""

    op: Literal["reference_time"] = "reference_time"
    which: Which
    calls: list[int]
    repeats: int
    warmup: int
    fresh: bool = False  # timed again, not the kept time


class BenchRequest(CandidateRequest, Request[BenchReply]):
    op: Literal["bench"] = "bench"
    which: Which
    repeats: int
    warmup: int
    torch_ops: list[str] = []  # the classes of torch ops the candidate may run (core/torch_ops.py)
    # where the checked timed calls' outputs go for the judge (the gate's outbox); None: checked in the
    # child itself (a bench with no judge beside it)
    outbox: str | None = None


class KeptReply(Message):
    checked: int


class KeptRequest(ProblemRequest, Request[KeptReply]):
    """The judge: a bench's kept timed calls' outputs, read from the outbox, against the reference's on
    the same contents (rebuilt from the bench's seeded draws), in a process no candidate code ran in."""

    op: Literal["kept"] = "kept"
    which: Which
    folder: str
    kept: list[KeptCall]
    seed: int = 100  # the rotation's first draw (core/handoff.py: BENCH_SEED, DUEL_SEED)


class DuelRequest(ProblemRequest, Request[DuelReply]):
    op: Literal["duel"] = "duel"
    a_source: str
    b_source: str
    which: Which
    repeats: int
    warmup: int
    a_torch_ops: list[str] = []  # the classes of torch ops each side may run (core/torch_ops.py)
    b_torch_ops: list[str] = []
    outbox: str | None = None  # as a bench's: where the checked timed calls' outputs go for the judge


class AnalyseRequest(ProblemRequest, Request[AnalyseReply]):
    op: Literal["analyse"] = "analyse"


class RooflineRequest(CandidateRequest, Request[RooflineReply]):
    op: Literal["roofline"] = "roofline"
    repeats: int = 5
    flops: float | None = None  # the reference's counts at the primary shape, from the run's analysis
    nbytes: float | None = None


class NcuRequest(CandidateRequest, Request[NcuReply]):
    op: Literal["ncu"] = "ncu"
    timeout_s: float = 400.0


AnyRequest = Annotated[
    DrawsRequest
    | TrialRequest
    | JudgeRequest
    | LaunchersRequest
    | ReferenceTimeRequest
    | BenchRequest
    | KeptRequest
    | DuelRequest
    | AnalyseRequest
    | RooflineRequest
    | NcuRequest,
    Field(discriminator="op"),
]


class Envelope(Message):
    """One frame from the client: the request and the task it serves (for the execution log)."""

    task: str = "-"
    request: AnyRequest


class Failure(Message):
    # memory: the device ran out of memory while other processes held part of it (the pool's, kb's fault)
    fault: Literal["candidate", "kb", "memory"]
    category: GateCategory | None = None  # a candidate's fault: the GateFailed category
    detail: str
    trace: str | None = None  # kb's fault: the end of the child's traceback


class Reply(Message):
    """One frame from the child. `result` is the op's reply as a document (validated by the client
    against the request's reply type); `recycle`: a candidate changed process-wide state (a clock, a
    synchronisation point), so the child must not be reused."""

    result: dict[str, Any] | None = None
    failure: Failure | None = None
    busy_s: float
    recycle: bool = False
