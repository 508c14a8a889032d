"""A problem no offline template family covers (a sort)."""

import torch
import torch.nn as nn

batch_size = 4
dim = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x, dim=1).values


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
