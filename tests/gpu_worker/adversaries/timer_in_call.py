"""Adversary: rebinds the timer while it runs (not at import, where the load's check sees it): a clock that
advances ten times slower from then on. Caught as `timer`: every call of the candidate is followed by the
check of the slots the harness calls, by identity (gpu_worker.pins)."""
import time

import triton
import triton.language as tl

REAL = time.perf_counter


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    time.perf_counter = lambda: REAL() / 10
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
