"""What the template package shares: the tuning-variant rule the GPU tools in tools/ apply to --knobs."""

from __future__ import annotations

import pytest

from kernelbrain.templates import FAMILIES, attention, knobs_with, row_softmax


def test_knobs_with_lays_overrides_on_the_first_round0_set_of_that_strategy():
    mat = next(k for k in attention.ROUND0 if k["strategy"] == "materialized")
    assert knobs_with(attention, {"strategy": "materialized", "block_m": 64}) == {**mat, "block_m": 64}
    # no strategy named: the family's first round-0 strategy
    assert knobs_with(row_softmax, {"num_warps": 2}) == {**row_softmax.ROUND0[0], "num_warps": 2}
    # a new knob is kept (how prefetch was first tried)
    online = next(k for k in row_softmax.ROUND0 if k["strategy"] == "online")
    assert knobs_with(row_softmax, {"strategy": "online", "x": 1}) == {**online, "x": 1}
    # a strategy no round-0 set has, reached by a mutation of the same name: laid on that move's knobs
    deferred = knobs_with(row_softmax, {"strategy": "deferred", "depth": 2})
    assert deferred == {**row_softmax.mutate(row_softmax.ROUND0[0], "deferred"), "depth": 2}
    assert deferred["ctas_per_sm"] == row_softmax.ROUND0[0]["ctas_per_sm"]
    # a move that only turns a knob names no strategy
    with pytest.raises(ValueError, match="no round-0 strategy 'prefetch'"):
        knobs_with(row_softmax, {"strategy": "prefetch"})
    with pytest.raises(ValueError, match="no round-0 strategy 'nope'; round 0 has split_row, single_pass"):
        knobs_with(row_softmax, {"strategy": "nope"})
    for family in FAMILIES:  # a whole knob set given as overrides keeps every value it names
        for k in family.ROUND0:
            merged = knobs_with(family, dict(k))
            assert {key: merged[key] for key in k} == k, (family.FAMILY, k)
