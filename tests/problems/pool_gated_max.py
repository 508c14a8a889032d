"""A KernelBench-format problem of kb's own: a gated 3-D max pooling with dilation, padding and ceil mode
(an elementwise chain on each element read, one on each window's result), which no hand-written family
covers."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 1, "channels": 2, "depth": 7, "height": 9, "width": 10}
batch_size = 2
channels = 3
depth = 7
height = 9
width = 10


class Model(nn.Module):
    def __init__(self, kernel_size: int = 3, stride: int = 2, padding: int = 1, dilation: int = 2):
        super().__init__()
        self.pool = nn.MaxPool3d(kernel_size, stride, padding, dilation, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.pool(torch.nn.functional.silu(x)) * 2.0)


def get_inputs():
    return [torch.randn(batch_size, channels, depth, height, width)]


def get_init_inputs():
    return [3, 2, 1, 2]
