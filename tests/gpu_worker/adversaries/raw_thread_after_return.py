"""Adversary: the same work left behind its call, in a thread started below the threading module
(`_thread.start_new_thread`: it is in no list of Python threads). Caught as `lazy-output`: the process's
own tasks are compared before and after each call."""
import _thread
import time

import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def _work(x, y):
    time.sleep(0.2)
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))


def run(inputs, out):
    _thread.start_new_thread(_work, (inputs["x"], out["y"]))
