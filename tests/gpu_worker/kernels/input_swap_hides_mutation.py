"""Cheat: its kernel uses the input as scratch, then it puts an untouched copy in the dict it was handed,
where a check that reads the dict after the call would look."""
import triton
import triton.language as tl


@triton.jit
def k_softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)
    tl.store(x_ptr + row * stride + cols, e, mask=cols < N)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = y.shape
    keep = x.clone()
    k_softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
    inputs["x"] = keep
