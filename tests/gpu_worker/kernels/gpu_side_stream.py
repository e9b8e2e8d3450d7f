"""Cheat: launches its kernel on a stream of its own and never joins it back, so events recorded on the
caller's stream see none of its work."""
import torch
import triton
import triton.language as tl

SIDE = []


@triton.jit
def k_softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    for _ in range(20):  # long enough to still run when the caller's events complete
        e = e * 1.0000001
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = y.shape
    if not SIDE:
        SIDE.append(torch.cuda.Stream())
    SIDE[0].wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(SIDE[0]):
        k_softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
