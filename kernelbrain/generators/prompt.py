"""The `llm` generator's prompts: deterministic text from the problem, the parent and the diagnosis.

The same inputs always give the same messages (no clocks, no randomness, sorted mappings), so a
prompt's blob hash identifies what the model was asked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.core.problem import REFERENCE_MULTIPLE


@dataclass(frozen=True)
class Hint:
    name: str  # short, stable: the proposal's strategy and knobs["hint"]
    axis: str
    text: str


# Round 0 spreads over the strategy axes (DESIGN.md, "Generation plane"); the first N are used.
STRATEGY_HINTS: tuple[Hint, ...] = (
    Hint(
        "decomposition",
        "algorithm and parallel decomposition",
        "Choose the algorithm and how work splits across programs: e.g. one program per output row "
        "or tile, a split-K / two-pass reduction across programs when a row is long, or an online "
        "(streaming) formulation that needs a single pass over the data.",
    ),
    Hint(
        "tiling",
        "tiling",
        "Focus on tiling: pick BLOCK sizes (powers of two) that fit the shapes, loop over tiles when a "
        "dimension exceeds one block, and choose num_warps/num_stages to match the tile size.",
    ),
    Hint(
        "memory-layout",
        "memory layout",
        "Focus on memory access: make loads and stores contiguous and coalesced along the fastest "
        "dimension, use strides instead of copies, vectorise with wide contiguous blocks, and avoid "
        "re-reading global memory (keep reused values in registers).",
    ),
    Hint(
        "fusion",
        "fusion",
        "Focus on fusion: do the whole computation (every op of the reference) in as few kernel "
        "launches as possible, ideally one, keeping intermediates in registers instead of writing "
        "them to global memory.",
    ),
)

# What to try for each profiler label (kernelbrain.core.diagnosis.LABELS); unknown labels pass through.
DIAGNOSIS_HINTS: dict[str, str] = {
    "memory-bound near peak": "The kernel already runs near DRAM bandwidth: cut the bytes moved "
    "(fuse passes, avoid re-reads, narrower intermediate types) rather than the instructions.",
    "memory-bound with poor coalescing": "Global accesses are poorly coalesced: make consecutive "
    "lanes touch consecutive addresses, use larger contiguous blocks, and avoid strided gathers.",
    "latency or occupancy-limited": "The kernel neither saturates memory nor compute: expose more "
    "parallelism (more programs, split long reductions), tune num_warps/num_stages, and shorten "
    "dependency chains.",
    "compute-bound": "The kernel is compute-bound: use tl.dot for matrix products, cheaper math "
    "(fewer divisions and transcendentals), and avoid redundant arithmetic.",
    "launch-bound": "Launch overhead dominates: fuse into fewer launches and give each program more "
    "work so tiny shapes need a single launch.",
    "register spills": "Registers spill to local memory: shrink the tile or BLOCK size, lower "
    "num_warps pressure, or split the work so fewer values are live at once.",
}

GATE_RULES: tuple[str, ...] = (
    "Define `class ModelNew(nn.Module)` whose `__init__` and `forward` take exactly the same "
    "parameters, with the same names and order, as the reference `Model`.",
    "Do the work in one or more `@triton.jit` kernels launched from `forward`.",
    "Write in kb's candidate subset, checked before anything runs: import only torch, torch.nn, "
    "torch.nn.functional, triton, triton.language, math and `from kernelbrain import candidate`; at module "
    "level only imports, constants, @triton.jit kernels, plain helper functions and class ModelNew; host "
    "code does arithmetic on ints and floats, reads tensor metadata (shape, stride(), dtype, device, "
    "numel()), allocates (torch.empty*), makes views and copies (view, reshape, contiguous, copy_, to) and "
    "launches kernels as `kernel[(n0, n1)](...)`: a grid is a tuple of ints, never a lambda; kernel bodies "
    "use tl.*, arithmetic and control flow only. Never use dunders, getattr/setattr, eval/exec, lambdas, "
    "nested functions, other classes, try/with/del/global, os, sys, time, numpy, ctypes, threading, "
    "torch.ops, torch.library, .item(), .tolist() or .data_ptr(). For a persistent grid take "
    "candidate.sm_count(x.device).",
    "Do not use torch operations that do the reference's work (e.g. torch.softmax, matmul, "
    "reductions, elementwise math); torch may only allocate outputs (torch.empty/empty_like) and "
    "reshape/view tensors.",
    "Do not call, import or instantiate the reference `Model`.",
    "Do not cache results, inputs or outputs across calls: every call must compute from its inputs.",
    "Do not use side CUDA streams, threads or processes.",
    "Do not modify the input tensors in place.",
    "Do not touch timers or synchronisation (time.*, torch.cuda.synchronize, Event patching).",
    "Write every element of every output: outputs are checked as if allocated NaN-filled.",
    "Match the reference within the tolerance (atol = rtol = {tolerance}, or {multiple}x PyTorch's own error "
    "against float64) on several random inputs, some signed and wide-ranged (magnitudes up to ~100).",
)

# the mode the reference and ModelNew are built and called in (ProblemAnalysed.mode)
MODES = {
    "training": "Model and ModelNew are called in training mode, as constructed: a batch norm normalises "
    "by the batch's statistics and updates its running_mean, running_var and num_batches_tracked buffers in "
    "place as torch does; those buffers are compared with the reference's after each call, like outputs.",
    "eval": "Model and ModelNew are called in eval mode: a batch norm normalises by its running statistics "
    "and updates nothing; dropout is the identity.",
}

SYSTEM = (
    "You are an expert GPU kernel engineer. You write correct, fast Triton kernels that replace "
    "PyTorch reference modules. Answer with one complete Python module in a single ```python code "
    "block: imports, the @triton.jit kernels and class ModelNew. No tests, no example usage."
)


def _ops(analysis: ProblemAnalysed) -> str:
    if not analysis.ops:
        return "(none recorded)"
    return "\n".join(f"- {json.dumps(op, sort_keys=True, default=str)}" for op in analysis.ops)


def _signature(analysis: ProblemAnalysed) -> str:
    sig = analysis.signature or {}
    # as declared, defaults and kinds included, where the analysis recorded them: ModelNew must take them
    init = ", ".join(["self", *(sig.get("params") or sig.get("init", []))])
    fwd = ", ".join(["self", *sig.get("forward", [])])
    return f"Model.__init__({init})\nModel.forward({fwd})"


def describe_numbers(results: Mapping[int, Any], profile: Any | None = None) -> str:
    """The parent's numbers: per rung and shape its timings (RungBenchmarked), then its profile."""
    lines = []
    for rung in sorted(results):
        r = results[rung]
        for s in r.shapes:
            lines.append(
                f"rung {rung}, shape {s.shape}: candidate {s.cand_median_s * 1e6:.1f} us "
                f"(iqr {s.cand_iqr_s * 1e6:.1f}), reference {s.ref_median_s * 1e6:.1f} us, "
                f"speedup {s.speedup:.3f}x"
            )
        lines.append(f"rung {rung} score: {r.score:.3f} ({r.timer})")
    if profile is not None:
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(profile.metrics.items()))
        lines.append(f"profile ({profile.source}): {metrics}")
        lines.append(f"profile labels: {', '.join(profile.labels) or 'none'}")
    return "\n".join(lines)


def build_messages(
    problem_source: str,
    analysis: ProblemAnalysed,
    hint: Hint | None = None,
    *,
    parent_source: str | None = None,
    numbers: str | None = None,
    labels: Sequence[str] = (),
    tolerance: float = 1e-4,
) -> list[dict[str, str]]:
    """System and user messages for one request (a round-0 hint, or a mutation of a parent)."""
    parts = [
        "Write a Triton replacement for this PyTorch reference module.",
        f"## Reference (the problem)\n```python\n{problem_source.rstrip()}\n```",
        f"## Signature\n{_signature(analysis)}",
        f"## Torch ops traced while running the reference\n{_ops(analysis)}",
    ]
    if analysis.shapes:
        parts.append(f"## Shapes it is benchmarked on (primary first)\n{', '.join(analysis.shapes)}")
    parts.append(f"## Mode\n{MODES[analysis.mode or 'eval']}")
    if parent_source is not None:
        parts.append(f"## Current kernel (the parent to improve)\n```python\n{parent_source.rstrip()}\n```")
    if numbers:
        parts.append(f"## Its numbers\n{numbers.rstrip()}")
    if labels:
        diag = "\n".join(
            f"- {label}: {DIAGNOSIS_HINTS.get(label, 'address this bottleneck.')}" for label in labels
        )
        parts.append(f"## Profiler diagnosis\n{diag}")
    if hint is not None:
        parts.append(f"## Strategy for this attempt ({hint.axis})\n{hint.text}")
    known = {"tolerance": f"{tolerance:g}", "multiple": REFERENCE_MULTIPLE}
    rules = "\n".join(f"{i}. {r.format(**known)}" for i, r in enumerate(GATE_RULES, 1))
    parts.append(f"## Rules (a checker enforces them; a violation rejects the kernel)\n{rules}")
    parts.append(
        "Reply with the complete module in one ```python block defining ModelNew"
        + (
            ", keeping what works in the current kernel and changing what the diagnosis points at."
            if parent_source
            else "."
        )
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts) + "\n"}]


def render(messages: Sequence[Mapping[str, str]]) -> str:
    """The messages as one text, stored as the proposal's prompt blob."""
    return "".join(f"### {m['role']}\n{m['content'].rstrip()}\n\n" for m in messages)
