"""A KernelBench-format problem of kb's own: an elementwise chain over two broadcast inputs (a gated,
clamped activation with a per-column shift), which no hand-written family covers."""

import torch
import torch.nn as nn
import torch.nn.functional as F

KB_SMOKE_SHAPE = {"batch_size": 7, "dim": 333}
batch_size = 7
dim = 333


class Model(nn.Module):
    def __init__(self, slope: float = 0.2, limit: float = 3.0):
        super().__init__()
        self.slope = slope
        self.limit = limit

    def forward(self, x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        z = F.leaky_relu(x - shift, self.slope)
        gated = torch.where(z > 0, z * torch.sigmoid(x), F.softplus(z))
        return torch.clamp(gated, max=self.limit) + 0.5 * torch.tanh(shift)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(1, dim)]


def get_init_inputs():
    return [0.2, 3.0]
