"""A KernelBench-format problem of kb's own, after level 2's 84: nn.Linear, a batch norm by the batch's
statistics at every call (no running statistics tracked: kb runs references in eval mode), a scale,
and a softmax over the features. The contraction family takes the linear in one kernel, the norm (the
moments family's: the statistics, then the map) in a second, the scaled softmax (the normalize
family's: a logsumexp per row, then its map) in a third."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 5, "in_features": 9, "out_features": 21}
batch_size = 32
in_features = 64
out_features = 48


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bn = nn.BatchNorm1d(out_features, track_running_stats=False)
        self.scale = nn.Parameter(torch.full((1,), 1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.scale * self.bn(self.gemm(x)), dim=1)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
