"""A KernelBench-format problem of kb's own, after level 2's 92 and 24: a 2-D convolution, a group norm
with its affine parameters, tanh, the convolution's value added back, and a softmax over the channels.
The conv family takes the convolution in one kernel; the tail reads its value twice: the group norm
(the moments family's) in a second launch, then the softmax (a logsumexp kept per pixel and its map:
the normalize family's) over the norm's chain and the convolution's value."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 2, "height": 7, "width": 5}
batch_size = 8
in_channels = 3
out_channels = 12
height = 20
width = 18
kernel_size = 3
groups = 4


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        z = torch.tanh(self.group_norm(y))
        return torch.softmax(y + z, dim=1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]
