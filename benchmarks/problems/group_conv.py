"""Grouped, strided, padded, dilated 2-D transposed convolution with an asymmetric kernel, no bias
(KernelBench level 1 style), with kb's shape extras."""

import torch
import torch.nn as nn

batch_size = 16
in_channels = 32
out_channels = 64
kernel_size = (3, 5)
height = 128
width = 256
stride = (2, 3)
padding = (1, 2)
dilation = (2, 1)
groups = 4
bias = False

# primary shape first; the ladder widens to the rest as it climbs
KB_SHAPES = [
    {"batch_size": 16, "height": 128, "width": 256},
    {"batch_size": 8, "height": 64, "width": 128},
]
# what a CPU run through the Triton interpreter measures
KB_SMOKE_SHAPE = {"batch_size": 1, "height": 4, "width": 6}


class Model(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: tuple,
        stride: tuple = (1, 1),
        padding: tuple = (0, 0),
        dilation: tuple = (1, 1),
        groups: int = 1,
        bias: bool = False,
    ):
        super().__init__()
        self.conv_transpose2d = nn.ConvTranspose2d(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=bias,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_transpose2d(x)


def get_inputs():
    x = torch.rand(batch_size, in_channels, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias]
