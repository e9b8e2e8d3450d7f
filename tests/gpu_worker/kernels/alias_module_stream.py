"""Cheat (stream): torch.cuda held in a module-level name, so that the stream calls through it read as
`cuda.Stream()` rather than `torch.cuda.Stream()`; the work runs on a side stream the timer never waits for."""
import torch
import triton
import triton.language as tl

cuda = torch.cuda
SIDE = []


@triton.jit
def k_softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = y.shape
    if not SIDE:
        SIDE.append(cuda.Stream())
    with cuda.stream(SIDE[0]):
        k_softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
