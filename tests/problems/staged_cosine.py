"""A KernelBench-format problem of kb's own: a cosine-similarity loss over rows (two row norms, a row sum
of the normalised product, a mean: four reductions in sequence), which no hand-written family covers."""

import torch
import torch.nn as nn
import torch.nn.functional as F

KB_SMOKE_SHAPE = {"batch_size": 6, "dim": 45}
batch_size = 6
dim = 45


class Model(nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean(1 - F.cosine_similarity(predictions, targets, dim=1))


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
