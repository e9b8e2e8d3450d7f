"""Canary: correct but slow softmax (one warp, 64-wide blocks, two passes over each row)."""

import triton
import triton.language as tl


@triton.jit
def canary_slow_softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    for start in range(0, N, BLOCK):
        x = tl.load(x_ptr + row * stride + start + cols, mask=start + cols < N, other=-float("inf"))
        m = tl.maximum(m, x)
    mx = tl.max(m, axis=0)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        x = tl.load(x_ptr + row * stride + start + cols, mask=start + cols < N, other=-float("inf"))
        s += tl.exp(x - mx)
    total = tl.sum(s, axis=0)
    for start in range(0, N, BLOCK):
        mask = start + cols < N
        x = tl.load(x_ptr + row * stride + start + cols, mask=mask, other=-float("inf"))
        tl.store(y_ptr + row * stride + start + cols, tl.exp(x - mx) / total, mask=mask)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    canary_slow_softmax[(M,)](x, y, N, x.stride(0), BLOCK=64, num_warps=1)
