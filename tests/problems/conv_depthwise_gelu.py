"""A KernelBench-format problem of kb's own: a depthwise, dilated, strided 1-D convolution (groups equal
to the input channels, which the smoke shape shrinks with them) then GELU, which no hand-written family
covers."""

import torch
import torch.nn as nn
import torch.nn.functional as F

KB_SMOKE_SHAPE = {"batch_size": 2, "in_channels": 3, "length": 19}
batch_size = 4
in_channels = 32
length = 257


class Model(nn.Module):
    def __init__(self, in_channels: int, kernel_size: int = 3, stride: int = 2, dilation: int = 2):
        super().__init__()
        self.conv1d = nn.Conv1d(
            in_channels, in_channels, kernel_size, stride, padding=2, dilation=dilation, groups=in_channels
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.conv1d(x))


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, 3, 2, 2]
