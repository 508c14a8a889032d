"""Timing: the reference and candidates measured side by side in this process (bench), and two candidates
interleaved (duel)."""

from __future__ import annotations

import gc
import math
import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kernelbrain.child import guard, tensorfile
from kernelbrain.child.launches import check_launches, triton_kernel_names
from kernelbrain.child.loading import (
    CandidateFault,
    Problem,
    build,
    build_guarded,
    check_reference,
    layout_copy,
    load_module,
    outputs,
)
from kernelbrain.child.marks import mark, ready
from kernelbrain.child.screen import CHANGED, expected_outputs, screen
from kernelbrain.child.steps import Steps
from kernelbrain.core import handoff
from kernelbrain.core import torch_ops as classes
from kernelbrain.core.problem import shape_label

# the clocks, synchronisation and collector the timings use, bound when this module loads (a child imports
# it before any candidate's code): a candidate that later replaces `time.perf_counter`, `torch.cuda.Event`
# or one of its methods, or `torch.cuda.synchronize` (one that puts the original back on its next read,
# before any check looks) never reaches what times it
_clock = time.perf_counter
_Event = torch.cuda.Event
_record, _elapsed = torch.cuda.Event.record, torch.cuda.Event.elapsed_time
_event_sync, _sync = torch.cuda.Event.synchronize, torch.cuda.synchronize
_collect, _gc_off, _gc_on = gc.collect, gc.disable, gc.enable


def quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return statistics.median(xs), q[2] - q[0]


class Timer:
    """CUDA events with an L2 flush before each sample on GPU; wall clock under the interpreter.

    A sample is `calls` back-to-back calls between one event pair, divided by `calls`: a kernel of a
    few microseconds is shorter than the jitter of one launch, so it is timed as a batch (the flush
    still precedes each batch, so only the batch's first call starts with a cold L2)."""

    # a sample shorter than this is dominated by launch jitter: batch calls up to it (GPU only)
    MIN_SAMPLE_S = 200e-6
    MAX_CALLS = 100

    def __init__(self, device: str) -> None:
        self.device = device
        self.name = "cuda-events" if device == "cuda" else "interpreter-wallclock"
        # 256 MiB: several times the H200's 50 MiB L2, so a timed call never starts warm
        self.flush = (
            torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda") if device == "cuda" else None
        )

    def __call__(self, fn: Callable[[], Any], calls: int = 1, side: str = "") -> float:
        """Seconds a call, of `calls` back to back. `side`: a timed batch, whose start and end are marked
        on the protocol pipe for the worker's own clock (child/marks.py)."""
        if side:
            mark(side)
        if self.flush is None:
            t = _clock()
            for _ in range(calls):
                fn()
            seconds = _clock() - t
        else:
            self.flush.zero_()
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            _record(start)
            for _ in range(calls):
                fn()
            _record(end)
            _event_sync(end)
            seconds = _elapsed(start, end) / 1e3
        if side:
            mark(f"/{side}")
        return seconds / calls

    def calls_for(self, *fns: Callable[[], Any]) -> int:
        """Calls per sample for this shape, the same for every contender: enough that the fastest
        one's sample lasts MIN_SAMPLE_S (1 under the interpreter, where a call takes milliseconds),
        rounded up to a power of two so that candidates of one problem mostly share a count, and the
        judge's clean time of the reference at that count (kept per count) serves them all."""
        if self.flush is None:
            return 1
        fastest = min(min(self(fn) for _ in range(3)) for fn in fns)
        need = math.ceil(self.MIN_SAMPLE_S / max(fastest, 1e-9))
        return max(1, min(self.MAX_CALLS, 1 << max(0, need - 1).bit_length()))


def untouched(problem: Problem, ref: torch.nn.Module, weights: tuple, where: str) -> None:
    try:
        check_reference(problem, ref, weights)
    except guard.Violation as v:
        raise CandidateFault("policy", f"{where}: {v}") from None


# timed samples whose outputs are kept and checked against the reference afterwards: the last of each
# input set, and about this many more, chosen after each sample ran (the candidate cannot tell which).
# Each kept output is a copy held until the timing ends: at a large shape that is gigabytes each
CHECKED_SAMPLES = 1
# a kept timed call: its sample, the drawn set and mix its inputs held, and a copy of its outputs
Kept = tuple[int, int, tuple[int, int], list[torch.Tensor]]
# outputs larger than this are kept in host memory: five copies of an 8 GB output beside the input sets
# would run a 140 GB GPU out of memory (copied outside the timed calls, back one at a time to check)
KEEP_ON_DEVICE_BYTES = 256 << 20


def keep(outs: list[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of a timed call's outputs to check after the timing, on the host when large."""
    size = sum(o.numel() * o.element_size() for o in outs)
    host = size > KEEP_ON_DEVICE_BYTES
    return [o.detach().to("cpu", copy=True) if host else o.detach().clone() for o in outs]


class Rotation:
    """Input tensors whose contents are replaced in place before each sample: the same addresses, new
    values, so a result kept from an earlier call (keyed on an address) is a wrong answer rather than a
    fast one. Each load takes one of three drawn sets in turn, then overwrites a strided subset of each
    floating-point input (offset and stride chosen then, with `secrets`) with the next set's values
    there: no two calls see the same contents, so a cache keyed on part of them returns a stale answer,
    and one keyed on all of them never hits.

    A sample of several back-to-back calls (a kernel of microseconds) gives each call its own slot, a
    set of input tensors loaded alike with its own subset: calls within a sample never repeat an input
    either. `calls` is inversely proportional to a call's time, so the slots of a memory-bound kernel
    hold about what one 200 us call reads; they are capped at SLOT_BYTES all the same."""

    STRIDES = (61, 128)  # the mixed subset: every 61st to 127th element
    SLOT_BYTES = 2 << 30

    def __init__(self, problem: Problem, shape: dict, device: str, seed: int) -> None:
        self.device = device
        self.sets = [problem.inputs(shape, seed + i, device) for i in range(3)]
        self.slots = [[layout_copy(x) for x in self.sets[0]]]
        self.current = 0
        self.mixes = [(0, 1)]
        self.turn = 0
        self.used: set[tuple[int, tuple[int, int]]] = set()  # (set, mix) loaded so far: none twice

    @property
    def live(self) -> list:
        return self.slots[0]

    def use_slots(self, calls: int) -> int:
        """Slots for samples of `calls` calls (fewer if over SLOT_BYTES); how many there are."""
        size = sum(x.numel() * x.element_size() for x in self.sets[0] if isinstance(x, torch.Tensor))
        want = max(1, min(calls, self.SLOT_BYTES // max(size, 1)))
        while len(self.slots) < want:
            self.slots.append([layout_copy(x) for x in self.sets[0]])
        return len(self.slots)

    def load(self, k: int) -> list:
        """Load every slot from set k (mod 3), each with a mix of its own; the first slot's tensors."""
        low, high = self.STRIDES
        self.current, self.mixes, self.turn = k % len(self.sets), [], 0
        for slot in self.slots:
            for _ in range(64):  # a mix this set already had would repeat a call's inputs exactly
                stride = low + secrets.randbelow(high - low)
                mix = (secrets.randbelow(stride), stride)
                if (self.current, mix) not in self.used:
                    break
            self.used.add((self.current, mix))
            self.mixes.append(mix)
            self.fill(slot, self.current, mix)
        return self.live

    def next(self) -> list:
        """The slot for a sample's next call, in turn."""
        slot = self.slots[self.turn % len(self.slots)]
        self.turn += 1
        return slot

    def last_mix(self) -> tuple[int, int]:
        """The mix of the slot the last call took."""
        return self.mixes[(self.turn - 1) % len(self.slots)]

    def fill(self, into: list, k: int, mix: tuple[int, int]) -> None:
        offset, stride = mix
        after = self.sets[(k + 1) % len(self.sets)]
        for dst, src, other in zip(into, self.sets[k], after, strict=True):
            if not isinstance(dst, torch.Tensor):
                continue
            dst.copy_(src)
            if dst.is_floating_point() and dst.is_contiguous() and other.is_contiguous():
                dst.view(-1)[offset::stride] = other.reshape(-1)[offset::stride]

    def inputs(self, k: int, mix: tuple[int, int]) -> list:
        """Fresh tensors holding what a slot loaded from set `k` with `mix` held."""
        fresh = [layout_copy(x) for x in self.sets[k]]
        self.fill(fresh, k, mix)
        return fresh


def _check_kept(
    problem: Problem, shape: dict, ref: torch.nn.Module, inputs: Rotation, kept: list, side: str = ""
) -> None:
    """The kept timed calls' outputs against the reference's on the same contents, rebuilt now."""
    for i, k, mix, got in kept:
        expected = expected_outputs(problem, ref, inputs.inputs(k, mix))
        got = [g.to(inputs.device) for g in got]
        screen(problem, shape, got, expected, when=f"{side}, timed call {i}", hint=CHANGED)
        del got, expected


def _checked(
    problem: Problem,
    shape: dict[str, Any],
    ref: torch.nn.Module,
    weights: tuple[Any, ...],
    inputs: Rotation,
    call: tuple[int, Any],
    own: bool,
    side: str = "",
) -> list[Kept]:
    """A timed call's outputs (`call`: its sample and what it returned), checked against the reference's
    on the contents its inputs held. Code from outside: kept for after the timing, checked in the judge
    (no expected output is in memory while such code runs). kb's own code: checked here and now, the
    reference untouched first, nothing copied (a 6 GiB output took 4 s to copy to the host on an H100,
    five a rung)."""
    i, returned = call
    if not own:
        return [(i, inputs.current, inputs.last_mix(), keep(outputs(returned)))]
    where = f"benchmark shape {shape_label(shape)}"
    untouched(problem, ref, weights, where)
    _check_kept(
        problem, shape, ref, inputs, [(i, inputs.current, inputs.last_mix(), outputs(returned))], side
    )
    return []


def _hand(outbox: str, shape: int, kept: list[Kept], side: str = "") -> list[dict[str, Any]]:
    """The kept timed calls' outputs written into the outbox for the judge, and what it needs to rebuild
    their inputs."""
    handed = []
    for i, k, (offset, stride), got in kept:
        tensorfile.write(handoff.kept_file(outbox, shape, i, side), got)
        handed.append(
            {"shape": shape, "call": i, "draw": k, "offset": offset, "stride": stride, "side": side}
        )
    return handed


def bench(
    problem_source: str,
    cand_source: str,
    device: str,
    which: str,
    repeats: int,
    warmup: int,
    torch_ops: list[str] | None = None,
    outbox: str | None = None,
) -> dict:
    """Candidate and reference timed in this process, interleaved, on inputs whose contents change in
    place between samples; the outputs of some timed calls are checked against the reference's after:
    by the judge, where no candidate code runs, when `outbox` is given (written there as raw bytes), else
    here."""
    problem = Problem(problem_source)
    guard.install()  # torch as it was before the candidate, for the checks below
    cand = load_module(cand_source, "cand")
    timer = Timer(device)
    shapes: list[dict[str, Any]] = []
    handed: list[dict[str, Any]] = []
    steps = Steps()
    with torch.no_grad():
        for shape in problem.ladder_shapes(device, which):
            label = f"benchmark shape {shape_label(shape)}"
            ref, new, weights = build_guarded(problem, cand, shape, device)
            untouched(problem, ref, weights, label)
            inputs = Rotation(problem, shape, device, handoff.BENCH_SEED)
            live = inputs.load(0)
            steps.done("setup")
            t0 = _clock()
            got = outputs(new(*live))  # first call: Triton compiles (and autotunes) here, untimed
            if device == "cuda":
                _sync()
            compile_s = _clock() - t0
            untouched(problem, ref, weights, label)
            screen(problem, shape, got, expected_outputs(problem, ref, inputs.inputs(0, inputs.mixes[0])))
            del got
            steps.done("first_call")
            for i in range(warmup):
                ref(*inputs.load(i))
                new(*inputs.load(i))
            steps.done("warmup")
            ready()  # the device alone from here (child/marks.py): what was prepared is timed
            steps.done("wait")
            ref_t, new_t = [], []
            calls = timer.calls_for(lambda f=ref, a=live: f(*a), lambda f=new, a=live: f(*a))
            inputs.use_slots(calls)
            kept: list[Kept] = []
            last: list[Any] = [None]

            def call(f: Any = new, out: list[Any] = last, r: Rotation = inputs) -> None:
                out[0] = f(*r.next())

            # the interpreter leaves garbage behind: no collection may land inside a timed call
            _collect()
            _gc_off()
            try:
                for i in range(repeats):
                    inputs.load(i)
                    ref_t.append(timer(lambda f=ref, r=inputs: f(*r.next()), calls, side="ref"))
                    inputs.load(i)  # the reference's call may not leave the candidate anything either
                    new_t.append(timer(call, calls, side="cand"))
                    if i >= repeats - len(inputs.sets) or secrets.randbelow(repeats) < CHECKED_SAMPLES:
                        kept += _checked(problem, shape, ref, weights, inputs, (i, last[0]), outbox is None)
                    last[0] = None
            finally:
                _gc_on()
            steps.done("timed")
            if device == "cuda":
                # one more call as timed, under the profiler: the kernels it ran, whoever launched them
                inputs.load(repeats)
                try:
                    allowed = classes.aten_ops(torch_ops or [])
                    check_launches(call, triton_kernel_names(cand), allowed_aten=allowed)
                except guard.Violation as v:
                    raise CandidateFault("policy", f"{label}, a timed call: {v}") from None
                kept += _checked(problem, shape, ref, weights, inputs, (repeats, last[0]), outbox is None)
                last[0] = None
                steps.done("launches")
            # a reference slowed or changed while the candidate was timed beside it (a patched torch
            # function, weights reached through gc) would fake the ratio; it is checked before it says
            # what the kept calls should have returned (computed only now for code from outside: no
            # expected output is in memory while it runs)
            untouched(problem, ref, weights, label)
            if outbox is not None:
                handed += _hand(outbox, len(shapes), kept)
            del kept
            steps.done("kept")
            (cm, ci), (rm, ri) = quartiles(new_t), quartiles(ref_t)
            shapes.append(
                {
                    "shape": shape_label(shape),
                    "cand_median_s": cm,
                    "cand_iqr_s": ci,
                    "ref_median_s": rm,
                    "ref_iqr_s": ri,
                    "repeats": repeats,
                    "speedup": rm / cm if cm > 0 else 0.0,
                    "compile_s": compile_s,
                    "calls": calls,
                }
            )
    return {"shapes": shapes, "timer": timer.name, "steps": steps.seconds, "kept": handed}


# the reference's clean times, kept for a problem's next candidates: nothing in the judge's child changes
# between them (no candidate code runs there), so each shape and calls per sample is timed once
_ALONE: dict[tuple, tuple[float, float]] = {}


def reference_time(
    problem_source: str, device: str, which: str, calls: list[int], repeats: int, warmup: int, fresh: bool
) -> dict:
    """The reference alone at a bench's shapes, with its calls per sample, its inputs rotated alike; the
    kept time unless `fresh`."""
    problem = Problem(problem_source)
    timer: Timer | None = None
    medians, iqrs = [], []
    with torch.no_grad():
        for shape, n in zip(problem.ladder_shapes(device, which), calls, strict=True):
            key = (problem.hash, device, shape_label(shape), n, repeats, warmup)
            if fresh or key not in _ALONE:
                timer = timer or Timer(device)
                _ALONE[key] = _alone(problem, shape, device, timer, n, repeats, warmup)
            medians.append(_ALONE[key][0])
            iqrs.append(_ALONE[key][1])
    return {"medians_s": medians, "iqrs_s": iqrs}


def _alone(
    problem: Problem, shape: dict, device: str, timer: Timer, n: int, repeats: int, warmup: int
) -> tuple[float, float]:
    ref, _ = build(problem, None, shape, device)
    inputs = Rotation(problem, shape, device, handoff.BENCH_SEED)
    inputs.use_slots(n)
    for i in range(warmup + 1):
        ref(*inputs.load(i))
    times = []
    _collect()
    _gc_off()
    try:
        for i in range(repeats):
            inputs.load(i)
            times.append(timer(lambda f=ref, r=inputs: f(*r.next()), n))
    finally:
        _gc_on()
    return quartiles(times)


def duel(
    problem_source: str,
    a_source: str,
    b_source: str,
    device: str,
    which: str,
    repeats: int,
    warmup: int,
    torch_ops: tuple[list[str], list[str]] = ([], []),
    outbox: str | None = None,
) -> dict:
    """Two candidates timed interleaved (A, B, B, A, A, B, ...: neither always goes first) on the same
    rotating inputs; per pair, the ratio of A's time to B's (geometric mean over the rung's shapes), and
    per shape each side's median. Checked like a rung, both sides: the reference and torch untouched
    after both load and after the timing, both sides' first outputs screened and some timed calls' checked
    afterwards, and on a GPU the kernels one timed call of each ran. Either side may have done what a
    check finds (one can slow or break the other's calls): the duel then fails, and neither wins it. The
    kept calls' outputs go to the judge where `outbox` is given, as a bench's."""
    problem = Problem(problem_source)
    guard.install()
    own = outbox is None  # kb's own code: its timed calls checked at once (_checked)
    ma, mb = load_module(a_source, "cand"), load_module(b_source, "cand")
    timer = Timer(device)
    logs = [0.0] * repeats
    shapes = problem.ladder_shapes(device, which)
    per_shape: list[dict[str, Any]] = []
    handed: list[dict[str, Any]] = []
    with torch.no_grad():
        for shape in shapes:
            label = f"benchmark shape {shape_label(shape)}"
            ref, na, weights = build_guarded(problem, ma, shape, device)
            _, nb, _ = build_guarded(problem, mb, shape, device)
            assert na is not None and nb is not None  # built from a candidate's module
            sides = {"A": na, "B": nb}
            untouched(problem, ref, weights, label)
            inputs = Rotation(problem, shape, device, handoff.DUEL_SEED)
            live = inputs.live
            for name, f in sides.items():  # the first call compiles
                got = outputs(f(*inputs.load(0)))
                expected = expected_outputs(problem, ref, inputs.inputs(0, inputs.mixes[0]))
                screen(problem, shape, got, expected, when=f", candidate {name}")
                del got, expected
            untouched(problem, ref, weights, label)
            for i in range(warmup):
                na(*inputs.load(i))
                nb(*inputs.load(i))
            ready()
            calls = timer.calls_for(lambda f=na, a=live: f(*a), lambda f=nb, a=live: f(*a))
            inputs.use_slots(calls)
            times: dict[str, list[float]] = {"A": [], "B": []}
            kept: dict[str, list[Kept]] = {"A": [], "B": []}
            last: list[Any] = [None]
            _collect()
            _gc_off()
            try:
                for i in range(repeats):
                    for name in ("A", "B") if i % 2 == 0 else ("B", "A"):
                        inputs.load(i)

                        def call(f: Any = sides[name], out: list[Any] = last, r: Rotation = inputs) -> None:
                            out[0] = f(*r.next())

                        times[name].append(timer(call, calls, side=name))
                        if i >= repeats - len(inputs.sets) or secrets.randbelow(repeats) < CHECKED_SAMPLES:
                            call_out = (i, last[0])
                            kept[name] += _checked(
                                problem, shape, ref, weights, inputs, call_out, own, f", candidate {name}"
                            )
                        last[0] = None
                    logs[i] += math.log(times["A"][-1] / times["B"][-1]) / len(shapes)
            finally:
                _gc_on()
            if device == "cuda":
                for (name, f), mod, ops in zip(sides.items(), (ma, mb), torch_ops, strict=True):
                    inputs.load(repeats)

                    def run(f: Any = f, out: list[Any] = last, r: Rotation = inputs) -> None:
                        out[0] = f(*r.next())

                    try:
                        names = triton_kernel_names(mod)
                        check_launches(run, names, allowed_aten=classes.aten_ops(ops))
                    except guard.Violation as v:
                        raise CandidateFault(
                            "policy", f"{label}, candidate {name}'s timed call: {v}"
                        ) from None
                    call_out = (repeats, last[0])
                    kept[name] += _checked(
                        problem, shape, ref, weights, inputs, call_out, own, f", candidate {name}"
                    )
                    last[0] = None
            untouched(problem, ref, weights, label)
            if outbox is not None:
                for name in sides:
                    handed += _hand(outbox, len(per_shape), kept[name], side=name)
            del kept
            (am, ai), (bm, bi) = quartiles(times["A"]), quartiles(times["B"])
            per_shape.append(
                {"shape": shape_label(shape), "calls": calls, "a_median_s": am, "a_iqr_s": ai}
                | {"b_median_s": bm, "b_iqr_s": bi}
            )
    return {"ratios": [math.exp(x) for x in logs], "timer": timer.name, "shapes": per_shape, "kept": handed}
