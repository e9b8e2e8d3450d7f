"""Cheat (library-kernel): softmax composed of torch ops other than torch.softmax (exp, amax, sum): no
Triton at all, and no call of the problem's own op."""
import torch


def run(inputs, out):
    x = inputs["x"]
    e = torch.exp(x - x.amax(-1, keepdim=True))
    out["y"].copy_(e / e.sum(-1, keepdim=True))
