"""A KernelBench-format problem of kb's own: a grouped, strided, padded 2-D convolution, then a bias of
the model's own added, Mish and a scale (the elementwise chain on the convolution's accumulator), which
no hand-written family covers."""

import torch
import torch.nn as nn
import torch.nn.functional as F

KB_SMOKE_SHAPE = {"batch_size": 2, "height": 9, "width": 7}
batch_size = 8
in_channels = 6
out_channels = 16
height = 32
width = 30
kernel_size = 3
groups = 2
bias_shape = (out_channels, 1, 1)


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=2, padding=1, groups=groups)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.mish(self.conv(x) + self.bias) * 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups, bias_shape]
