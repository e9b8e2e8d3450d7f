"""Softmax over the last dimension, in KernelBench form, with no parameters (a problem file for tests)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 16
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_cpu_inputs():
    return [torch.randn(8, 300)]


def get_init_inputs():
    return []
