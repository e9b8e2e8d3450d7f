"""Adversary: the answer computed by numpy, reached by a name it never bound. Under Triton's interpreter a
kernel's first launch rewrites it among its module's globals, and the interpreter adds its own names there
(numpy as `np` among them); a no-op launch at import would leave `np` in this module for `run` to use, and
numpy reads a CPU tensor through the array protocol, which the dispatch guard does not see. Refused by the
static rules (a name bound nowhere); with them off, the interpreter's names never reach this module, so
`np` is not defined when `run` needs it."""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def nothing(x_ptr):
    pass


nothing[(1,)](torch.zeros(1))


def run(inputs, out):
    x = inputs["x"]
    a = np.reshape(np.append(x, x[:0]), x.shape)  # noqa: F821
    e = math.e ** (a - a.max(axis=1, keepdims=True))
    out["y"].copy_(torch.as_tensor(e / e.sum(axis=1, keepdims=True)))
