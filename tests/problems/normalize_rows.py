"""A KernelBench-format problem of kb's own: each row scaled by the inverse of its mean absolute value,
then gated by a per-column input (a reduce-then-map normalisation no hand-written family covers)."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 5, "dim": 301}
batch_size = 5
dim = 301


class Model(nn.Module):
    def __init__(self, eps: float = 1e-4):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        scale = 1.0 / (torch.mean(torch.abs(x), dim=1, keepdim=True) + self.eps)
        return x * scale * torch.sigmoid(gate)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(dim)]


def get_init_inputs():
    return [1e-4]
