"""A Triton candidate for tests/baselines/files/rmsnorm.py: one program per row."""

import triton
import triton.language as tl


@triton.jit
def _rmsnorm(x_ptr, w_ptr, y_ptr, N, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(y_ptr + row * stride + cols, x * r * w, mask=mask)


def run(inputs, out):
    x, w, y = inputs["in0"], inputs["weight"], out["out0"]
    M, N = x.shape
    _rmsnorm[(M,)](x, w, y, N, x.stride(0), 1e-6, BLOCK=triton.next_power_of_2(N))
