"""A KernelBench-format problem of kb's own: the suffix sum of a masked, scaled signal along the middle
axis (a reverse scan written with flips, a bool mask, a chain after it), which no hand-written family
covers."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 2, "steps": 19, "channels": 5}
batch_size = 3
steps = 45
channels = 5


class Model(nn.Module):
    def __init__(self, scale: float = 0.5):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        suffix = torch.cumsum((x * mask).flip(1), dim=1).flip(1)
        return torch.tanh(suffix * self.scale)


def get_inputs():
    return [torch.randn(batch_size, steps, channels), torch.rand(batch_size, steps, channels) > 0.3]


def get_init_inputs():
    return [0.5]
