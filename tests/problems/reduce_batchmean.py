"""A KernelBench-format problem of kb's own: a KL divergence averaged over the batch (`batchmean`: the sum
divided by `x.size(0)` in Python, a number in the trace), which only a second trace shows is a size."""

import torch
import torch.nn as nn
import torch.nn.functional as F

KB_SMOKE_SHAPE = {"batch_size": 5, "classes": 33}
batch_size = 64
classes = 1000


class Model(nn.Module):
    def forward(self, log_pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.kl_div(log_pred, target, reduction="batchmean")


def get_inputs():
    return [torch.randn(batch_size, classes).log_softmax(-1), torch.randn(batch_size, classes).softmax(-1)]


def get_init_inputs():
    return []
