"""Row-wise log-sum-exp, in KernelBench form (a problem file for tests of what a candidate's torch may do):
its reference calls torch.logsumexp, and a candidate composed of other torch ops must still be refused."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(x, dim=1, keepdim=True)


batch_size = 64
dim = 8192


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_cpu_inputs():
    return [torch.randn(8, 300)]


def get_init_inputs():
    return []
