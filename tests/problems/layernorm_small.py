"""LayerNorm over the last two dims (KernelBench level 1 "LayerNorm" style: nn.LayerNorm(normalized_shape)),
with its affine weight and bias drawn at random so a kernel that skips them cannot pass."""

import torch
import torch.nn as nn

batch_size = 16
features = 64
dim = 1024

KB_SHAPES = [{"batch_size": 16, "features": 64, "dim": 1024}]
# D = features * dim = 240: no power of two
KB_SMOKE_SHAPE = {"batch_size": 3, "features": 5, "dim": 48}


class Model(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super(Model, self).__init__()  # noqa: UP008 - KernelBench spelling, rewritten in ModelNew
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.randn(batch_size, features, dim)]


def get_init_inputs():
    return [(features, dim)]
