"""Parametrised Triton templates, one folder per op family (families/<family>/).

Each family satisfies `base.Family`: `FAMILY`, `matches(ops, graph)` (the spec it extracts from the
traced reference, or None), `ROUND0` (knob sets spreading over its strategy axes), `MUTATIONS`
(bottleneck label -> knob moves), `mutate(knobs, move)`, `feasible(spec, knobs)` and
`render(spec, knobs, signature) -> str` (a standalone module defining ModelNew); a `base.Refining`
one also reads what the trace cannot show from the problem's source (`refine`). Every family's kernels
are real `@triton.jit` functions in its folder's `parts` module, copied into the candidate by `render`.

`cross_entropy` composes negative log-likelihood losses from the graph (`aten._log_softmax` then
`aten.nll_loss_forward`, as `F.cross_entropy` traces), with class weights, ignore_index and every
reduction mode.

`contraction` composes one GEMM-like op (`aten.mm`, `aten.addmm`, `aten.bmm`, with the views
torch.matmul, F.linear and einsum decompose into) and the pointwise chain after it, fused on the fp32
accumulator tile; it comes after gemm_epilogue and gemv, so they keep the cases they were measured on.
`conv` composes forward convolutions (1-D to 3-D; strided, zero-padded, dilated, grouped and depthwise,
with or without bias) with the elementwise chain after them into one implicit-GEMM kernel;
`conv_transpose` the transposed ones (1-D to 3-D, output padding too) the same way, by stride phases.
These three are heads (`base.Head`): FAMILIES holds them as `compose` wraps them, with the launches the
composer cuts off and composes before and after them.

Shared, not families: `base` (the contracts and the helpers every family uses), `sizing` (powers of
two, blocks, warps), `limits` (the device limits by compute capability), `render` (the one renderer),
`rewrite` (graph rewriting), `model_source` (what a template reads from the problem's source),
`decompose` (ATen ops split before the composed families read the graph), `families/row_norm` (the
strategies and knobs layernorm and l2norm share), and `compose` (the composer above the families;
`compose.partial`, the candidates that keep allowed torch ops, is kept under this package's name too).
"""

from typing import Any

from kernelbrain.templates.base import Family
from kernelbrain.templates.compose import contraction, conv, conv_transpose
from kernelbrain.templates.compose import partial as partial
from kernelbrain.templates.families import (
    attention,
    cross_entropy,
    gemm_epilogue,
    gemv,
    l2norm,
    layernorm,
    moments,
    normalize,
    pointwise,
    pool,
    reduce,
    rmsnorm,
    row_softmax,
    scan,
    staged,
)

# each matcher wants its own op sequence, so the order only breaks ties; gemv late: it takes any lone
# matmul of a vector or a few columns; pointwise, from the graph, any chain of elementwise ops
FAMILIES: tuple[Family, ...] = (
    row_softmax,
    rmsnorm,
    layernorm,
    l2norm,
    gemm_epilogue,
    attention,
    conv_transpose,
    conv,
    gemv,
    contraction,
    pointwise,
    reduce,
    scan,
    pool,
    moments,
    normalize,
    staged,
    cross_entropy,
)


def knobs_with(family: Family, over: dict[str, Any]) -> dict[str, Any]:
    """A tuning variant: `over` laid on the family's first round-0 knob set of the strategy it names (of
    the family's first strategy when it names none; for a strategy only a mutation reaches, on what
    that move makes of the first set), as the GPU tools in tools/ take their --knobs."""
    strategy = over.get("strategy", family.ROUND0[0]["strategy"])
    base = next((k for k in family.ROUND0 if k["strategy"] == strategy), None)
    if base is None and any(move == strategy for moves in family.MUTATIONS.values() for move, _ in moves):
        # a strategy only a mutation reaches: the knobs that move gives the first round-0 set (a move
        # that only turns a knob, like prefetch, names no strategy)
        moved = family.mutate(family.ROUND0[0], strategy)
        base = moved if moved is not None and moved["strategy"] == strategy else None
    if base is None:
        known = ", ".join(dict.fromkeys(k["strategy"] for k in family.ROUND0))
        raise ValueError(f"{family.FAMILY} has no round-0 strategy {strategy!r}; round 0 has {known}")
    return {**base, **over}
