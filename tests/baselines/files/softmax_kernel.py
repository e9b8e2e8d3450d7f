"""A Triton candidate for tests/baselines/files/softmax.py: one program per row, the max subtracted."""

import triton
import triton.language as tl


@triton.jit
def _softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


def run(inputs, out):
    x, y = inputs["in0"], out["out0"]
    M, N = x.shape
    _softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
