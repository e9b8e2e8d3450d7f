"""Adversary: numpy reached through a kernel's own globals. A name the module binds only where it never
runs is absent from its globals; a @triton.jit function that reads it, called from host code (under the
interpreter a kernel called so returns its value), would hand back whatever the interpreter's rewrite finds
under that name among the kernel's globals. The rewrite adds only its own helpers there, so `np` is
undefined in the kernel."""
import math

import torch
import triton
import triton.language as tl

if False:
    np = 0


@triton.jit
def numpy_please():
    return np


def run(inputs, out):
    n = numpy_please()
    x = inputs["x"]
    a = n.reshape(n.append(x, x[:0]), x.shape)
    e = math.e ** (a - a.max(axis=1, keepdims=True))
    out["y"].copy_(torch.as_tensor(e / e.sum(axis=1, keepdims=True)))
