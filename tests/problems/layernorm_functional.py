"""LayerNorm over the last dim spelled F.layer_norm with the model's own weight and bias parameters,
bf16 input (the parameters stay fp32, as torch allows)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
seq = 128
hidden = 4096

KB_SHAPES = [{"batch_size": 32, "seq": 128, "hidden": 4096}]
KB_SMOKE_SHAPE = {"batch_size": 2, "seq": 7, "hidden": 200}


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(hidden) + 0.5)
        self.bias = nn.Parameter(torch.randn(hidden) * 0.1)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, eps=self.eps)


def get_inputs():
    return [torch.randn(batch_size, seq, hidden, dtype=torch.bfloat16)]


def get_init_inputs():
    return [hidden]
