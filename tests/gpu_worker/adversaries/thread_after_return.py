"""Adversary: returns at once and computes in a thread it leaves running, after making the harness's output
check wait for that thread (the copy the harness takes of each output, Tensor.to, joins it first): the
work is done, and checked right, but after the timed call returned. Caught as `lazy-output`: a thread of
the candidate's still alive when its call returns is refused before anything else runs."""
import threading

import torch
import triton
import triton.language as tl

PENDING = []
_to = torch.Tensor.to


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def _waiting_to(self, *args, **kwargs):
    while PENDING:
        PENDING.pop().join()
    return _to(self, *args, **kwargs)


def _work(x, y):
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))


def run(inputs, out):
    torch.Tensor.to = _waiting_to
    t = threading.Thread(target=_work, args=(inputs["x"], out["y"]))
    t.start()
    PENDING.append(t)
