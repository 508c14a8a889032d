"""A KernelBench-format problem of kb's own, after level 2's 14_Gemm_Divide_Sum_Scaling: a matmul by a
parameter's transpose, a divide, a row sum kept as a column and a scale. The contraction family takes
the matmul and the divide in one kernel and the row sum and scale (the reduce family's) in a second."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 5, "input_size": 19, "hidden_size": 23, "scaling_factor": 1.5}
batch_size = 32
input_size = 64
hidden_size = 48
scaling_factor = 1.5


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, scaling_factor: float):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden_size, input_size))
        self.scaling_factor = scaling_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.matmul(x, self.weight.T)
        x = x / 2
        x = torch.sum(x, dim=1, keepdim=True)
        return x * self.scaling_factor


def get_inputs():
    return [torch.rand(batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, scaling_factor]
