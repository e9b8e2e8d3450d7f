"""Adversary: rewrites the times the timing loop has recorded so far, found in its frame (sys._getframe
walk): every earlier repetition of the block made to look instantaneous. Caught as `escape` in a sandbox;
where frames are reachable anyway, the recorded times are a tuple it cannot change."""
import sys

import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    f = sys._getframe(1)
    while f is not None:
        times = f.f_locals.get("times")
        if isinstance(times, list):
            times[:] = [1e-6] * len(times)
        f = f.f_back
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
