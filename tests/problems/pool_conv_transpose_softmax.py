"""A KernelBench-format problem of kb's own, after level 2's 38: an average pool, a 3-D transposed
convolution of its value, a clamp, a softmax over the flattened spatial dims and a scale per channel.
The pool (the pool family's) is a launch of its own that makes the convolution's input; the
conv_transpose family takes the convolution and the clamp in one kernel; the softmax over the flattened
dims is a logsumexp over the spatial dims and its map, the scale in it (the normalize family's)."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 2, "depth": 4, "height": 6, "width": 4}
batch_size = 4
in_channels = 3
out_channels = 5
depth, height, width = 8, 10, 8


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, clamp_min=0.0, clamp_max=1.0):
        super().__init__()
        self.avg_pool = nn.AvgPool3d(2)
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, 3, 2, 1, output_padding=1)
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max
        self.scale = nn.Parameter(torch.ones(1, out_channels, 1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.clamp(self.conv_transpose(self.avg_pool(x)), self.clamp_min, self.clamp_max)
        b, c, d, h, w = x.shape
        return torch.softmax(x.view(b, c, -1), dim=2).view(b, c, d, h, w) * self.scale


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
