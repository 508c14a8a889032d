"""A KernelBench-format problem of kb's own, after level 2's 28: nn.Linear, an instance norm of its rows
unsqueezed to [batch, 1, 1, features] and squeezed back, a residual add and a multiply by a second
input. The contraction family takes the linear in one kernel; the tail is the instance norm (the moments
family's, the unsqueezes and squeezes views of its input and output) in a second launch, then the
elementwise rest (pointwise) in a third."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 5, "in_features": 9, "out_features": 21}
batch_size = 16
in_features = 32
out_features = 48


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.instance_norm = nn.InstanceNorm2d(1)  # the rows, unsqueezed: one channel

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.instance_norm(self.linear(x).unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1)
        return (x + y) * y


def get_inputs():
    return [torch.randn(batch_size, in_features), torch.randn(batch_size, out_features)]


def get_init_inputs():
    return [in_features, out_features]
