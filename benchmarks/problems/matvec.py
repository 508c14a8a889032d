"""Matrix-vector product C = A @ B, A (M, K), B (K, 1) (KernelBench level 1 style), with kb's shape extras."""

import torch
import torch.nn as nn

M = 2048
K = 1048576

# primary shape first; the ladder widens to the rest as it climbs
KB_SHAPES = [{"M": 2048, "K": 1048576}, {"M": 256, "K": 131072}]
# what a CPU run through the Triton interpreter measures
KB_SMOKE_SHAPE = {"M": 64, "K": 4096}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    A = torch.rand(M, K)
    B = torch.rand(K, 1)
    return [A, B]


def get_init_inputs():
    return []
