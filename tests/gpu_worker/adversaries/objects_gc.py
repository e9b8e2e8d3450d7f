"""Adversary: finds the harness's timing set among all objects (gc.get_objects), to read the pool and the
value generator. Caught as `escape`."""
import gc

import triton
import triton.language as tl

FOUND = []


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    FOUND[:] = [o for o in gc.get_referrers(inputs)] + [o for o in gc.get_objects() if type(o).__name__ == "TimingSet"]
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
