"""LayerNorm over the last dimension, in KernelBench form (a problem file for tests): nn.LayerNorm starts at
weight 1 and bias 0, values that make both no-ops unless the harness varies them."""

import torch
import torch.nn as nn

batch_size = 128
features = 4096


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.ln = nn.LayerNorm(num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_cpu_inputs():
    return [torch.randn(16, 200)]


def get_init_inputs():
    return [features]


def get_cpu_init_inputs():
    return [200]
