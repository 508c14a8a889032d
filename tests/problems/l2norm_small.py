"""L2 normalisation over dim 1 (KernelBench level 1 "L2Norm_" spelling)."""

import torch
import torch.nn as nn

batch_size = 16
dim = 16384

KB_SHAPES = [{"batch_size": 16, "dim": 16384}]
# 300 columns: no power of two
KB_SMOKE_SHAPE = {"batch_size": 5, "dim": 300}


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()  # noqa: UP008 - KernelBench spelling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.norm(x, p=2, dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
