"""A KernelBench-format problem of kb's own, shaped as KernelBench's level-1 cross-entropy loss: the mean
cross entropy of a batch of logits against class indices (a log-softmax over the classes, then a gather
at each row's target), which no hand-written family covers."""

import torch
import torch.nn as nn

KB_SMOKE_SHAPE = {"batch_size": 37, "num_classes": 45}
batch_size = 32768
num_classes = 4096


class Model(nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(predictions, targets)


def get_inputs():
    return [torch.rand(batch_size, num_classes), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []
