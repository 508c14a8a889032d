"""The op families, one folder each: the family (matching, knobs, mutation, rendering) in its
`__init__`, its `@triton.jit` kernels and their launchers in `parts` beside it. `row_norm` is no family
of its own: the strategies and kernels layernorm and l2norm share."""
