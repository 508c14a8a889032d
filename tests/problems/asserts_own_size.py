"""A reference that asserts its input's size (512 KiB in, 512 KiB out): no fitted shape is one it takes,
so kb runs it at the file's own size and says so."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        assert x.shape == (128, 1024), f"expected 128 x 1024 inputs, got {tuple(x.shape)}"
        return torch.sigmoid(x) * x


batch_size = 128
dim = 1024


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
