"""RMS normalisation over the channel dim of an NCHW tensor, no weight (KernelBench level 1 style).

y = x / sqrt(mean(x ** 2, dim=1) + eps)
"""

import torch
import torch.nn as nn

batch_size = 112
features = 64
dim1 = 512
dim2 = 512
eps = 1e-5

# primary shape first; the ladder widens to the rest as it climbs
KB_SHAPES = [
    {"batch_size": 112, "features": 64, "dim1": 512, "dim2": 512},
    {"batch_size": 16, "features": 64, "dim1": 256, "dim2": 256},
]
# what a CPU run through the Triton interpreter measures
KB_SMOKE_SHAPE = {"batch_size": 2, "features": 64, "dim1": 8, "dim2": 16}


class Model(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + self.eps)
        return x / rms


def get_inputs():
    x = torch.rand(batch_size, features, dim1, dim2)
    return [x]


def get_init_inputs():
    return [features, eps]
