"""Parametrised Triton templates, one module per op family.

Each module exposes `FAMILY`, `matches(ops) -> dict | None` (the spec it extracts from the traced
reference, or None), `ROUND0` (knob sets spreading over the family's strategy axes), `MUTATIONS`
(bottleneck label -> knob moves), `mutate(knobs, move)`, `feasible(spec, knobs)` (whether a knob set
can serve the traced shape) and `render(spec, knobs, signature) -> str` (a standalone module defining
ModelNew).
"""

from kernelbrain.templates import attention, conv_transpose, gemm_epilogue, gemv, rmsnorm, row_softmax

# gemv last: the trace records only matmul's first operand, so any matmul would match it
FAMILIES = (row_softmax, rmsnorm, gemm_epilogue, attention, conv_transpose, gemv)
