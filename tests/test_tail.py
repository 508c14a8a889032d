"""templates/tail: where a compute-bound op's pointwise chain ends, the tail graph after it (its INPUT 0
the chain's value, its further inputs forward's tensors and parameters), the family that composes it
and the renamed parts that let it sit beside the head's in one module."""

from __future__ import annotations

import ast

import pytest
import torch
import torch.nn.functional as F

from kernelbrain.core.graph import INPUT
from kernelbrain.templates import contraction, tail
from kernelbrain.templates.render import renamed
from tests.composed import graph_of


def _split(fn, *shapes):
    graph = graph_of(fn, *shapes)
    at = next(i for i, n in enumerate(graph.nodes) if n.op in contraction.CONTRACTIONS)
    return tail.split(graph, at, contraction.VIEWS)


def test_renamed_suffixes_whole_words_only():
    text = "def _launch(x):\n    return _reduce_launch(x) + _launch_more(_launch)\n"
    out = renamed(text, "_t", ["_launch"])
    assert out == "def _launch_t(x):\n    return _reduce_launch(x) + _launch_more(_launch_t)\n"
    assert renamed(text, "_t", []) == text


def test_a_chain_that_reaches_the_output_has_no_tail():
    assert _split(lambda a, b: torch.relu(a @ b) * 2, (5, 4), (4, 6)) is None


def test_the_tail_reads_the_chain_value_first_then_forward_tensors():
    cut = _split(
        lambda a, b, r: (lambda y: (y - y.amax(1, keepdim=True)) * r)(a @ b / 2), (5, 4), (4, 6), (5, 6)
    )
    assert cut is not None
    h, head, rest = cut
    assert head.outputs == [list(h)] and head.nodes[h[0]].op == "aten.div.Tensor"
    inputs = [n for n in rest["graph"].nodes if n.op == INPUT]
    assert inputs[0].outs[0].shape == [5, 6] and rest["sources"] == [["input", 2]]
    composed = tail.compose(rest, "contraction", contraction.VIEWS)
    assert composed["family"] == "normalize" and composed["then"] is None


def test_a_tail_no_family_takes_whole_is_composed_in_segments():
    fn = lambda x, w: F.gelu((lambda s: s - s.mean())(F.linear(x, w).sum(dim=1)))  # noqa: E731
    cut = _split(fn, (5, 4), (6, 4))
    assert cut is not None
    composed = tail.compose(cut[2], "contraction", contraction.VIEWS)
    assert composed["family"] == "reduce" and composed["then"]["family"] == "normalize"
    text = tail.render_parts(composed)
    names = [n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]
    assert len(names) == len(set(names)) and all(n.endswith(("_tail", "_tail2")) for n in names)
    lines = tail.call(composed, ["kb_h"], "kb_h")
    assert "_reduce_launch_tail(" in lines and "_launch_tail2(" in lines


def test_an_op_no_family_takes_is_named():
    cut = _split(lambda a, b: torch.softmax(a @ b, 1), (5, 4), (4, 6))
    assert cut is not None
    with pytest.raises(tail.NotTail, match=r"aten\._softmax\.default after the contraction"):
        tail.compose(cut[2], "contraction", contraction.VIEWS)


def test_a_norm_is_a_moments_stage_reading_its_weights_by_name():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.GroupNorm(2, 6), torch.nn.Hardtanh())
    cut = _split(model, (5, 4))
    assert cut is not None
    composed = tail.compose(cut[2], "contraction", contraction.VIEWS)
    assert composed["family"] == "moments" and composed["then"]["family"] == "pointwise"
    assert composed["spec"]["mode"] == "group" and composed["spec"]["weight"] == "1.weight"
    lines = tail.call(composed, ["kb_h", *("x" for _ in composed["sources"])], "kb_h")
    assert "_moments_launch_tail(kb_h, 'group', 2, self.get_parameter('1.weight')" in lines
    assert "_launch_tail2(" in lines
    names = [n.name for n in ast.parse(tail.render_parts(composed)).body if isinstance(n, ast.FunctionDef)]
    assert len(names) == len(set(names)) and all(n.endswith(("_tail", "_tail2")) for n in names)


def test_a_pooling_is_cut_after_its_squeezes_and_the_chain_goes_to_the_next_stage():
    fn = lambda x, w: F.gelu(F.avg_pool1d(F.linear(x, w).unsqueeze(1), 2).squeeze(1)).amax(1)  # noqa: E731
    cut = _split(fn, (5, 4), (6, 4))
    assert cut is not None
    composed = tail.compose(cut[2], "contraction", contraction.VIEWS)
    assert composed["family"] == "pool" and composed["spec"]["post"] == [["squeeze", -2], ["squeeze", 1]]
    assert composed["then"]["family"] == "reduce"
