"""A Triton candidate for tests/baselines/files/logsumexp.py: one program per row, the max subtracted."""

import triton
import triton.language as tl


@triton.jit
def _logsumexp(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    m = tl.max(x, axis=0)
    tl.store(y_ptr + row, m + tl.log(tl.sum(tl.exp(x - m), axis=0)))


def run(inputs, out):
    x, y = inputs["in0"], out["out0"]
    M, N = x.shape
    _logsumexp[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
