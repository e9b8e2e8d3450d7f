"""Stores far outside the output: a CUDA illegal memory access (GPU fault test)."""

import triton
import triton.language as tl


@triton.jit
def oob_store(y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    tl.store(y_ptr + row * N + cols + (1 << 40), tl.zeros([BLOCK], dtype=tl.float32), mask=cols < N)


def run(inputs, out):
    y = out["y"]
    M, N = y.shape
    oob_store[(M,)](y, N, BLOCK=triton.next_power_of_2(N))
