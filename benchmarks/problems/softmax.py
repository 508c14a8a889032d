"""Softmax over dim 1 (KernelBench level 1 style), with kb's optional shape extras."""

import torch
import torch.nn as nn

batch_size = 4096
dim = 393216

# primary shape first; the ladder widens to the rest as it climbs
KB_SHAPES = [{"batch_size": 4096, "dim": 393216}, {"batch_size": 16, "dim": 16384}]
# what a CPU run through the Triton interpreter measures
KB_SMOKE_SHAPE = {"batch_size": 8, "dim": 1000}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
