"""Adversary: leaves the dispatch guard on the stack but switches Python dispatch off around torch's own
softmax (torch._C._DisableTorchDispatch), so that no mode sees the op. Caught as `escape`."""
import torch


def run(inputs, out):
    with torch._C._DisableTorchDispatch():
        y = torch.softmax(inputs["x"], -1)
    out["y"].copy_(y)
