"""Asks for far more device memory than any GPU has (GPU fault test)."""

import torch


def run(inputs, out):
    scratch = torch.empty(1 << 45, dtype=torch.uint8, device=out["y"].device)  # 32 TiB
    out["y"].copy_(scratch[: out["y"].numel()].view(out["y"].shape))
