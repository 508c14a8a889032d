"""A KernelBench-format problem of kb's own, after level 2's 32_Conv2d_Scaling_Min: a padded 2-D
convolution, a scale, and the minimum over the channels kept as one. The conv family takes the
convolution and the scale in one kernel and the minimum (the reduce family's tail) in a second."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 2, "height": 7, "width": 5}
batch_size = 8
in_channels = 5
out_channels = 12
height = 20
width = 18
kernel_size = 3
scale_factor = 2.0


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, scale_factor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.scale_factor = scale_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x) * self.scale_factor
        return torch.min(x, dim=1, keepdim=True)[0]


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scale_factor]
