"""The gate's input draws beyond the problem's own: what each seed holds, and how far a wide one reaches.

- Seed 0: the problem's own draw (`get_inputs()`).
- Odd seeds: heavy-tailed. Magnitudes Pareto (type II, tail index `PARETO_ALPHA` = 1: a normal-like body,
  half of them under 1, and a tail where one element in n reaches about n), random sign, capped at the
  input's span. They take the standard normal draw's place: seed 0 is that for most KernelBench files
  (`torch.randn`), and the body still checks ordinary values while the tail shows what only an outlier
  does (a softmax offset by a constant instead of its row max overflows past 88 + the offset).
- Even seeds: wide-range, signed, magnitudes log-uniform from 1e-2 to the input's span: every decade in
  between equally often.

An input's span is how far the reference stays finite and right (the judge searches it,
`kernelbrain/child/judge.py`): the widest of `SPANS` on which the reference, all inputs at once, is finite
wherever the float64 truth is; from 100, each floating-point input's upward through `UPWARD`, the others
held, up to what its dtype holds (`span_limit`) and while the reference errs no more than there, then
divided by `HEADROOM`. A softmax's reaches 1e32, an RMSNorm's 1e10; a fixed `exp(x - 60)` overflows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

# the wide draws' largest magnitude, tried in turn until the reference stays finite on them
SPANS = (100.0, 30.0, 10.0, 3.0, 1.0)
# then each input's span upward, as long as the reference stays finite (squares: few reference runs)
UPWARD = (1e4, 1e8, 1e16, 1e32, 1e38)
# an honest kernel's intermediates may run past the reference's by its number of terms (a flash
# attention's unnormalised P V sums up to a key count of values; the reference normalises first): the
# spans found are divided by this, never below SPANS[0]
HEADROOM = 1e6
PARETO_ALPHA = 1.0
LOWEST = 1e-2  # the wide draws' smallest magnitude


def is_wide(seed: int) -> bool:
    """Whether a seed's draw is the wide-range one (its values reach the span)."""
    return seed > 0 and seed % 2 == 0


def span_limit(dtype: torch.dtype) -> float:
    """The widest span a dtype holds with room to spare: a draw at it never rounds to inf."""
    return min(1e38, float(torch.finfo(dtype).max) / 2)


def _spans(inputs: list[Any], span: float | Sequence[float]) -> list[float]:
    return [float(span)] * len(inputs) if isinstance(span, int | float) else [float(s) for s in span]


def variant(inputs: list[Any], seed: int, span: float | Sequence[float] = SPANS[0]) -> list[Any]:
    """The draw of `seed` (module docstring) from the problem's own `inputs`; `span`: the largest magnitude,
    one for all inputs or one an input."""
    if seed == 0:
        return inputs
    spans = _spans(inputs, span)
    # drawn where the input lives: a host draw of a GPU gate shape's tens of millions of float64 values
    # cost seconds a seed
    gens: dict[torch.device, torch.Generator] = {}
    out = []
    for x, top in zip(inputs, spans, strict=True):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            g = gens.setdefault(x.device, torch.Generator(device=x.device).manual_seed(seed))
            top = min(top, span_limit(x.dtype))
            # drawn in float32 (float64 for a float64 input), in place: a full-size input of gigabytes
            # has no float64 temporaries beside it
            work = torch.float64 if x.dtype == torch.float64 else torch.float32
            v = torch.rand(x.shape, generator=g, dtype=work, device=x.device)
            if seed % 2:  # Pareto II: (1 - u)^(-1/alpha) - 1, u in [0, 1)
                v.neg_().add_(1).pow_(-1 / PARETO_ALPHA).sub_(1).clamp_(max=top)
            else:
                low, high = math.log(LOWEST), math.log(top)
                v.mul_(high - low).add_(low).exp_().clamp_(max=top)
            sign = torch.randint(0, 2, x.shape, generator=g, dtype=torch.int8, device=x.device)
            v.mul_(sign.mul_(2).sub_(1))
            x = v.to(x.dtype)
        out.append(x)
    return out
