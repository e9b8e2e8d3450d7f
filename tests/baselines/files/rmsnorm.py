"""Row-wise RMSNorm with a learned scale, in KernelBench form (a problem file for tests and docs)."""

import torch
import torch.nn as nn

batch_size = 256
features = 8192


class Model(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_cpu_inputs():
    return [torch.randn(16, 200)]


def get_init_inputs():
    return [features]


def get_cpu_init_inputs():
    return [200]


FLOPS = 4 * batch_size * features
BYTES_MOVED = 4 * (2 * batch_size * features + features)
