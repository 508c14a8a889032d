"""The raw tensor files a trial's outputs reach the judge in: they read back bit for bit, and a file
whose header lies (a candidate's child writes them) is Unreadable, never a tensor of the wrong size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelbrain.child import tensorfile
from kernelbrain.core.handoff import header_of


def test_tensors_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    wide = torch.randn(4, 6)
    tensors = [
        torch.randn(3, 4),
        torch.arange(5),
        torch.randn(2, 3).to(torch.bfloat16),
        torch.empty(0, 3),
        wide[:, ::2],  # strided: written contiguous
        torch.tensor([True, False]),
    ]
    tensorfile.write(path, tensors)
    got = tensorfile.read(path, "cpu")
    assert [type(t) for t in got] == [torch.Tensor] * len(tensors)
    for a, b in zip(tensors, got, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ({"tensors": [{"dtype": "float32", "shape": [1000]}]}, "holds 16 bytes"),
        ({"tensors": [{"dtype": "object", "shape": [4]}]}, "dtype object"),
        ({"tensors": [{"dtype": "float32", "shape": [-4]}]}, "shape [-4]"),
        ({"tensors": [{"dtype": "float32", "shape": [4]}], "code": "x"}, "does not read"),
        ("not a header", "does not read"),
    ],
)
def test_a_header_that_lies_is_unreadable(tmp_path: Path, header: object, words: str) -> None:
    path = tmp_path / "out.bin"
    tensorfile.write(path, [torch.randn(4)])
    header_of(path).write_text(json.dumps(header))
    with pytest.raises(tensorfile.Unreadable, match=words.replace("[", r"\[").replace("]", r"\]")):
        tensorfile.read(path, "cpu")


def test_a_missing_header_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    tensorfile.write(path, [torch.randn(4)])
    header_of(path).unlink()
    with pytest.raises(tensorfile.Unreadable, match="does not read"):
        tensorfile.read(path, "cpu")
