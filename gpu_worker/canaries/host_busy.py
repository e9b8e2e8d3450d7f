"""Timing canary: the fast canary's device work after host-side busy work (a few hundred microseconds
of Python before the launch). Device time must not see it: it measures 0.97-1.03x the fast canary."""

import triton
import triton.language as tl


@triton.jit
def canary_busy_softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    z = x - tl.max(x, axis=0)
    e = tl.exp(z)
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


def _host_work() -> int:
    s = 0
    for i in range(12000):  # about 0.3-0.6 ms of interpreter time on a current host core
        s += i * i
    return s


def run(inputs, out):
    _host_work()
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    block = triton.next_power_of_2(N)
    canary_busy_softmax[(M,)](x, y, N, x.stride(0), BLOCK=block, num_warps=8 if block >= 2048 else 4)
