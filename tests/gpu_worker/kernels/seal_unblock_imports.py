"""Cheat (the guard's own machinery): takes the guard's import blocker out of sys.meta_path at load, so
that importlib can bring in the harness's modules, then computes the right answer honestly."""
import sys

import triton
import triton.language as tl

sys.meta_path[:] = [m for m in sys.meta_path if type(m).__name__ != "ImportBlocker"]


@triton.jit
def k_softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    k_softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
