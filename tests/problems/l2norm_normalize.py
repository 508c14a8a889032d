"""L2 normalisation spelled F.normalize(x, p=2, dim=-1) (x / max(||x||, eps)), fp16 input."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 64
seq = 256
dim = 1024

KB_SHAPES = [{"batch_size": 64, "seq": 256, "dim": 1024}]
KB_SMOKE_SHAPE = {"batch_size": 3, "seq": 5, "dim": 72}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, p=2, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, seq, dim, dtype=torch.float16)]


def get_init_inputs():
    return []
