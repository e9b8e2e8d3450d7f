"""Cheat: after each call it leaves a buffer of its own layout (rows padded to 512) in the inputs dict, so
that a harness refilling that dict's entries between timed calls re-lays the next values out for it,
untimed. Handed its own buffer back, it writes zeros: a harness that lets it through fails it."""
import torch
import triton
import triton.language as tl

PAD = 512


@triton.jit
def k_softmax(x_ptr, y_ptr, N, sx, sy, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * sx + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * sy + cols, e / tl.sum(e, 0), mask=cols < N)


@triton.jit
def k_zeros(y_ptr, N, sy, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    tl.store(y_ptr + row * sy + cols, tl.zeros([BLOCK], tl.float32), mask=cols < N)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = y.shape
    if x.stride(0) == PAD:
        k_zeros[(M,)](y, N, y.stride(0), BLOCK=triton.next_power_of_2(N))
        return
    k_softmax[(M,)](x, y, N, x.stride(0), y.stride(0), BLOCK=triton.next_power_of_2(N))
    pad = torch.empty((M, PAD), dtype=x.dtype, device=x.device).narrow(1, 0, N)
    pad.copy_(x)
    inputs["x"] = pad
