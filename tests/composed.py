"""Helpers of the tests of the families composed from the traced graph (pointwise, reduce, normalize):
a graph captured from a function or model on meta tensors, and a rendered source loaded as a module."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from kernelbrain.child.graph import capture
from kernelbrain.core.graph import Graph


class Lambda(torch.nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(*xs)


def graph_of(model: torch.nn.Module | Callable, *shapes: tuple[int, ...]) -> Graph:
    """The graph of `model` (a function is wrapped in a module), on one meta tensor per shape."""
    model = model if isinstance(model, torch.nn.Module) else Lambda(model)
    return capture(model, [torch.empty(s, device="meta") for s in shapes])


def load(source: str, folder: Path, name: str) -> ModuleType:
    """`source` imported from folder/name.py (Triton reads a kernel's source from its file)."""
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
