"""Adversary: takes the dispatch guard off torch's stack for the length of its call (torch's own helpers,
_pop_mode and _push_mode), lets torch compute the softmax, and puts the guard back before the call
returns, where the guard's stacks are compared. Caught as `escape`: the entries that pop a dispatch mode
refuse candidate code (gpu_worker.guard_torch)."""
import torch
from torch.utils._python_dispatch import _pop_mode, _push_mode


def run(inputs, out):
    mode = _pop_mode()
    try:
        y = torch.softmax(inputs["x"], -1)
    finally:
        _push_mode(mode)
    out["y"].copy_(y)
