"""A KernelBench-format problem of kb's own: a grouped 3-D transposed convolution with stride,
padding, output padding and dilation differing per dim, then a bias of the model's own added, HardSwish
and a scale (the elementwise chain on the convolution's accumulator), in the style of KernelBench
level 2's ConvTranspose3d files."""

import torch
import torch.nn as nn
import torch.nn.functional as F

KB_SMOKE_SHAPE = {"batch_size": 1, "depth": 3, "height": 4, "width": 3}
batch_size = 4
in_channels = 8
out_channels = 16
depth, height, width = 8, 16, 16
kernel_size = (3, 2, 3)
groups = 2
bias_shape = (out_channels, 1, 1, 1)


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, bias_shape):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(
            in_channels,
            out_channels,
            kernel_size,
            stride=(2, 1, 2),
            padding=(1, 0, 1),
            output_padding=(1, 0, 1),
            groups=groups,
            dilation=(1, 2, 1),
        )
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardswish(self.conv_transpose(x) + self.bias) * 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups, bias_shape]
