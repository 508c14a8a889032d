"""A KernelBench-format problem of kb's own, for partial kernels (`kb run --allow-torch conv`): a 3-D
transposed convolution with an output padding, a group norm, then a Swish and a scale. With the
convolution left to PyTorch, the norm and the chain after it are composed in Triton (the moments family,
then pointwise)."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 2, "depth": 3, "height": 3, "width": 4}
batch_size = 4
in_channels = 3
out_channels = 8
groups = 4
depth = 6
height = 6
width = 8
kernel_size = 3


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.conv = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=2, output_padding=1)
        self.norm = nn.GroupNorm(groups, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x))
        return x * torch.sigmoid(x) * 2.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]
