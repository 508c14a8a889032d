"""A KernelBench-format problem of kb's own: group normalisation with its affine weight and bias over a
3-D feature map (statistics of each sample's groups), which no hand-written family covers."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 3, "channels": 6, "depth": 4, "height": 5, "width": 7}
batch_size = 8
channels = 12
depth = 8
height = 16
width = 16


class Model(nn.Module):
    def __init__(self, channels: int, groups: int = 3):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups=groups, num_channels=channels, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(x)


def get_inputs():
    return [torch.randn(batch_size, channels, depth, height, width) * 2 + 3]


def get_init_inputs():
    return [channels, 3]
