"""A KernelBench-format problem of kb's own, after level 2's 30_Gemm_GroupNorm_Hardtanh: nn.Linear, a
group norm with its affine parameters, hardtanh. The contraction family takes the linear in one kernel,
the group norm (the moments family's, its weights read by name) in a second and hardtanh in a third."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 5, "in_features": 19, "out_features": 24}
batch_size = 32
in_features = 64
out_features = 48
num_groups = 4  # one at every shape: moments reads it from the trace


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, num_groups: int):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.hardtanh = nn.Hardtanh(min_val=-2.0, max_val=2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hardtanh(self.group_norm(self.gemm(x)))


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]
