"""A KernelBench-format problem of kb's own: a hinge loss reduced to one value, with targets of shape
(cols,) broadcast along the predictions' rows (KernelBench's 100_HingeLoss, whose tensors are
32768 x 32768): the reduce family reads the targets in place and gives each row a partial."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 6, "cols": 1500}
batch_size = 64
cols = 4096


class Model(nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


def get_inputs():
    return [torch.rand(batch_size, cols), torch.randint(0, 2, (cols,)).float() * 2 - 1]


def get_init_inputs():
    return []
