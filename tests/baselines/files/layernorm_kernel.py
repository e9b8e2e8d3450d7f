"""A Triton candidate for tests/baselines/files/layernorm.py: one program per row, the affine applied."""

import triton
import triton.language as tl


@triton.jit
def _layernorm(x_ptr, w_ptr, b_ptr, y_ptr, N, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / N
    d = tl.where(mask, x - mean, 0.0)
    r = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * stride + cols, d * r * w + b, mask=mask)


def run(inputs, out):
    x, w, b, y = inputs["in0"], inputs["ln.weight"], inputs["ln.bias"], out["out0"]
    M, N = x.shape
    _layernorm[(M,)](x, w, b, y, N, x.stride(0), 1e-5, BLOCK=triton.next_power_of_2(N))
