import torch
import torch.nn as nn

batch_size = 16
dim = 16384

KB_SHAPES = [{"batch_size": 16, "dim": 16384}]
KB_SMOKE_SHAPE = {"batch_size": 8, "dim": 200}


class Model(nn.Module):
    """Softmax over dim 1."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
