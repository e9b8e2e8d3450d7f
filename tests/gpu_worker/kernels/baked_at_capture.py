"""Cheat: computes honestly when called eagerly and keeps the result; while a CUDA graph is being captured
it records only a copy of that kept result, so every replay hands back the answer of an earlier input."""
import torch
import triton
import triton.language as tl

KEPT = []


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
    if torch.cuda.is_current_stream_capturing() and KEPT:
        y.copy_(KEPT[-1])
        return
    k_softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
    KEPT.append(y.clone())
    del KEPT[:-1]
