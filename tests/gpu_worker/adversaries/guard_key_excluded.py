"""Adversary: excludes the Python dispatch key, where the guard's mode is called from, around torch's own
softmax. Caught as `escape`."""
import torch


def run(inputs, out):
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
    with torch._C._ExcludeDispatchKeyGuard(keys):
        y = torch.softmax(inputs["x"], -1)
    out["y"].copy_(y)
