"""Cheat (lazy-output): launches nothing; leaves a TorchFunctionMode on torch's stack that writes the
right answer into the output the first time the harness touches it (a copy, a comparison, a download)."""
import torch
from torch.overrides import TorchFunctionMode

PENDING = []


class Complete(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        while PENDING:
            x, y = PENDING.pop()
            with torch._C.DisableTorchFunction():
                y.copy_(torch.softmax(x.float(), -1).to(y.dtype))
        return func(*args, **(kwargs or {}))


MODE = Complete()
ENTERED = []


def run(inputs, out):
    PENDING.append((inputs["x"], out["y"]))
    if not ENTERED:
        ENTERED.append(MODE.__enter__())
