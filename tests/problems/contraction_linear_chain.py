"""A KernelBench-format problem of kb's own: a Linear layer over a 3-D input, then a scale by a
parameter, a leaky ReLU, a residual add of a forward input and a clamp, which no hand-written family
covers (gemm_epilogue takes ReLU and a divide only)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

KB_SMOKE_SHAPE = {"batch_size": 2, "seq": 5, "in_features": 19, "out_features": 23}
batch_size = 4
seq = 16
in_features = 64
out_features = 48


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = nn.Parameter(torch.randn(out_features) * 0.5 + 1.0)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        y = self.linear(x) * self.scale
        y = F.leaky_relu(y, 0.1) + residual
        return torch.clamp(y, -1.5, 2.0)


def get_inputs():
    return [torch.randn(batch_size, seq, in_features), torch.randn(batch_size, seq, out_features)]


def get_init_inputs():
    return [in_features, out_features]
