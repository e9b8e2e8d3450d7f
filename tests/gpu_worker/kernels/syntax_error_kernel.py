"""Compile error: tl.arange with a non-constexpr bound."""
import triton
import triton.language as tl


@triton.jit
def k_bad(x_ptr, y_ptr, N, stride):
    cols = tl.arange(0, N)
    tl.store(y_ptr + cols, tl.load(x_ptr + cols))


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    k_bad[(M,)](x, y, N, x.stride(0))
