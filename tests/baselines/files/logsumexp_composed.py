"""A cheat for tests/baselines/files/logsumexp.py: no Triton, and not the reference's own torch.logsumexp,
but the same answer composed of other torch ops (amax, exp, sum, log)."""

import torch


def run(inputs, out):
    x = inputs["in0"]
    m = x.amax(1, keepdim=True)
    out["out0"].copy_(m + torch.log(torch.exp(x - m).sum(1, keepdim=True)))
