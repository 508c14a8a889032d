"""A KernelBench-format problem of kb's own, after level 1's 86: a depthwise-separable 2-D convolution, a
depthwise 3x3 convolution then a pointwise 1x1 one, each with its bias. The conv family takes the
pointwise convolution (the more multiply-adds) as the head the search tunes; the depthwise one is its
prelude, a launch of the same family before it at its first feasible round-0 knobs."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 2, "height": 7, "width": 9}
batch_size = 4
in_channels = 6
out_channels = 16
height = 20
width = 18


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, padding: int = 1):
        super().__init__()
        self.depthwise = nn.Conv2d(in_channels, in_channels, kernel_size, padding=padding, groups=in_channels)
        self.pointwise = nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
