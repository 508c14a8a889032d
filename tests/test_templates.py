"""What the template package shares: the one Family contract, kernels only in the families' `parts`
modules, and the tuning-variant rule the GPU tools in tools/ apply to --knobs."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from kernelbrain import templates
from kernelbrain.templates import FAMILIES, knobs_with
from kernelbrain.templates.base import Family, Refining
from kernelbrain.templates.families import attention, row_softmax


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


def test_every_family_keeps_the_one_contract():
    """Each module in FAMILIES has the Family protocol's names, with its methods' parameters as named
    there (the expert generator calls them by these names)."""
    contract = {
        name: list(inspect.signature(getattr(Family, name)).parameters)[1:]
        for name in ("matches", "feasible", "mutate", "render")
    }
    for family in FAMILIES:
        assert isinstance(family, Family), family.__name__
        for name, params in contract.items():
            assert list(inspect.signature(getattr(family, name)).parameters) == params, (
                family.__name__,
                name,
            )
        if hasattr(family, "refine"):
            assert isinstance(family, Refining)
        assert family.ROUND0 and all("strategy" in k for k in family.ROUND0), family.__name__


def test_no_family_keeps_kernel_text_in_strings():
    """Kernels are real functions in `parts` modules: no family module (nor a shared helper of theirs)
    holds a kernel's Triton source in a string (the one generated text is render.chain's elementwise
    function of a traced graph's ops), and every parts module defines jit functions ruff and tests see."""
    folder = Path(templates.__file__).parent
    seen = {"parts": 0, "other": 0}
    for path in folder.rglob("*.py"):
        text = path.read_text()
        name = str(path.relative_to(folder))
        if path.stem == "parts":
            assert re.search(r"^@triton\.jit\b", text, re.M), name
            seen["parts"] += 1
            continue
        seen["other"] += 1
        strings = [n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant)]
        kernel = [s for s in strings if isinstance(s, str) and re.search(r"tl\.(load|store|program_id)\(", s)]
        assert not kernel, (name, kernel[0][:80])
        assert not re.search(r"@[A-Z_]{3,}@", text), name
    # every family folder's kernels were read, and every module beside them
    assert seen["parts"] >= 15 and seen["other"] >= 25, seen
