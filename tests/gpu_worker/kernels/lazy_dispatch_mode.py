"""Cheat (lazy-output): the same with a TorchDispatchMode left on the dispatch stack after the call."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

PENDING = []


class Complete(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        while PENDING:
            x, y = PENDING.pop()
            y.copy_(torch.exp(x.float() - x.float().amax(-1, keepdim=True)).to(y.dtype))
            y.div_(y.sum(-1, keepdim=True))
        return func(*args, **(kwargs or {}))


MODE = Complete()
ENTERED = []


def run(inputs, out):
    PENDING.append((inputs["x"], out["y"]))
    if not ENTERED:
        ENTERED.append(MODE.__enter__())
