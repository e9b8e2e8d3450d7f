"""Cheat: skips the last row (left to whatever was in the buffer)."""
import triton
import triton.language as tl


@triton.jit
def k_unwritten(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    k_unwritten[(M - 1,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
