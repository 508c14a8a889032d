"""A KernelBench-format problem of kb's own: a temperature-scaled cross entropy with class weights the
model holds as a buffer, padding rows ignored (ignore_index), summed over the batch (a chain on the
logits, a weighted gather, rows skipped), which no hand-written family covers."""

import torch
import torch.nn as nn
import torch.nn.functional as F

KB_SMOKE_SHAPE = {"batch_size": 21, "num_classes": 1100}
batch_size = 8192
num_classes = 1000


class Model(nn.Module):
    def __init__(self, num_classes: int, temperature: float = 1.5):
        super().__init__()
        self.temperature = temperature
        self.register_buffer("class_weight", torch.linspace(0.5, 2.0, num_classes))

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            logits / self.temperature, labels, weight=self.class_weight, ignore_index=-1, reduction="sum"
        )


def get_inputs():
    labels = torch.randint(0, num_classes, (batch_size,))
    labels[::5] = -1  # padding
    return [torch.randn(batch_size, num_classes) * 4, labels]


def get_init_inputs():
    return [num_classes]
