"""Cheat: output depends on call count (a stand-in for a racy kernel or garbage memory)."""
import triton
import triton.language as tl

STATE = {"calls": 0}


@triton.jit
def k_nd(x_ptr, y_ptr, N, stride, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + cols, scale * e / tl.sum(e, axis=0), mask=mask)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    STATE["calls"] += 1
    scale = 1.0 + 1e-4 * (STATE["calls"] > 6)
    k_nd[(M,)](x, y, N, x.stride(0), scale, BLOCK=triton.next_power_of_2(N))
