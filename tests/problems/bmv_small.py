"""Batched matrix-vector product C = bmm(A, x), A (B, M, K), x (B, K, 1), with kb's shape extras."""

import torch
import torch.nn as nn

batch = 64
M = 256
K = 8192

KB_SHAPES = [{"batch": 64, "M": 256, "K": 8192}]
# M = 19 and K = 333: no multiple of any BLOCK_M or BLOCK_K
KB_SMOKE_SHAPE = {"batch": 3, "M": 19, "K": 333}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, x)


def get_inputs():
    return [torch.rand(batch, M, K), torch.rand(batch, K, 1)]


def get_init_inputs():
    return []
