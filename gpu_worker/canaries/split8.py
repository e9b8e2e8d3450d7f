"""Timing canary: the fast canary's work as eight launches of an eighth of the rows each. Its judged time
may exceed the fast canary's by no more than their profiler kernel times do: launch count alone is no cost
to device time."""

import triton
import triton.language as tl


@triton.jit
def canary_split_softmax(x_ptr, y_ptr, row0, N, stride, BLOCK: tl.constexpr):
    row = row0 + tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    z = x - tl.max(x, axis=0)
    e = tl.exp(z)
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    block = triton.next_power_of_2(N)
    part = triton.cdiv(M, 8)
    for row0 in range(0, M, part):
        rows = min(part, M - row0)
        canary_split_softmax[(rows,)](x, y, row0, N, x.stride(0), BLOCK=block, num_warps=8 if block >= 2048 else 4)
