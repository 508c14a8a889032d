"""Linear (with bias), ReLU, then divide by a constant (KernelBench level 2 style), with kb's shape extras."""

import torch
import torch.nn as nn

batch_size = 1024
in_features = 8192
out_features = 8192
divisor = 2.0

# primary shape first; the ladder widens to the rest as it climbs
KB_SHAPES = [
    {"batch_size": 1024, "in_features": 8192, "out_features": 8192},
    {"batch_size": 128, "in_features": 1024, "out_features": 512},
]
# what a CPU run through the Triton interpreter measures
KB_SMOKE_SHAPE = {"batch_size": 16, "in_features": 64, "out_features": 32}


class Model(nn.Module):
    def __init__(self, in_features, out_features, divisor):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.divisor = divisor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        x = torch.relu(x)
        x = x / self.divisor
        return x


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, divisor]
