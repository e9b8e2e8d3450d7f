"""Adversary: leaves code for the interpreter to run later, inside the harness's own work: a garbage
collector's callback (it runs at the next collection, wherever that falls). Caught as `escape`."""
import gc

import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def _later(phase, info):
    pass


def run(inputs, out):
    if _later not in gc.callbacks:
        gc.callbacks.append(_later)
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
