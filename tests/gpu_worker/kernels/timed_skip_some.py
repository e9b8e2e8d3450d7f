"""Cheat: correct while compiled and verified (at most 10 calls), then, once it is being timed, it skips
the work on every third call and writes zeros: a check of one timed call picked at random misses it
two times in three; each timed call's fingerprint does not. It refuses CUDA-graph capture, so that its
Python runs at every timed call (a replay would repeat the captured work)."""
import torch
import triton
import triton.language as tl

CALLS = [0]


@triton.jit
def k_softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


@triton.jit
def k_zeros(y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    tl.store(y_ptr + row * stride + cols, tl.zeros([BLOCK], tl.float32), mask=cols < N)


def run(inputs, out):
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("not capturable")
    x, y = inputs["x"], out["y"]
    M, N = y.shape
    CALLS[0] += 1
    if CALLS[0] <= 10 or CALLS[0] % 3:
        k_softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
    else:
        k_zeros[(M,)](y, N, y.stride(0), BLOCK=triton.next_power_of_2(N))
