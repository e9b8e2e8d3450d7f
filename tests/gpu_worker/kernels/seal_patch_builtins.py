"""Cheat (the guard's own machinery): replaces a builtin the guard's hook calls when it decides (any),
so that every frame looks like the library's, then computes the right answer."""
import builtins

import triton
import triton.language as tl

builtins.any = lambda _items: True


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
