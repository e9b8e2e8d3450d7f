"""Adversary: takes torch's original stack entry out of the guard's wrapper (its default arguments) to pop
the guard unseen. Caught as `escape`: candidate code may not read a function's defaults."""
import torch


def run(inputs, out):
    pop = torch._C._pop_torch_dispatch_stack.__defaults__[0]
    mode = pop(None)
    try:
        y = torch.softmax(inputs["x"], -1)
    finally:
        torch._C._push_on_torch_dispatch_stack(mode)
    out["y"].copy_(y)
