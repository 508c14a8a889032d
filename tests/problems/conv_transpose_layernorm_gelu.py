"""A KernelBench-format problem of kb's own, after level 2's 34: a 3-D transposed convolution, a layer
norm over the last (spatial) dim with its affine parameters, GELU and a scale. The conv_transpose family
takes the convolution in one kernel; the tail is the layer norm (the layernorm family's kernels over the
rows of the last dim) in a second launch, then the elementwise rest (pointwise) in a third."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 2, "depth": 3, "height": 2, "width": 3}
batch_size = 4
in_channels = 3
out_channels = 5
depth, height, width = 6, 5, 7
kernel_size = 3
stride = 2
padding = 1


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, norm_size, scale=0.75):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride, padding)
        self.layer_norm = nn.LayerNorm(norm_size)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.layer_norm(self.conv_transpose(x))) * self.scale


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    out_width = (width - 1) * stride - 2 * padding + kernel_size
    return [in_channels, out_channels, kernel_size, stride, padding, out_width]
