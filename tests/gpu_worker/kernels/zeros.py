"""Cheat: writes zeros (degenerate output)."""
import triton
import triton.language as tl


@triton.jit
def k_zeros(y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    tl.store(y_ptr + row * stride + cols, tl.zeros([BLOCK], tl.float32), mask=cols < N)


def run(inputs, out):
    y = out["y"]
    M, N = y.shape
    k_zeros[(M,)](y, N, y.stride(0), BLOCK=triton.next_power_of_2(N))
