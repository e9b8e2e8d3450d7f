"""Adversary: the values of timed calls predicted and answered ahead. From the timing loop's frame it reads
the timing set, the repetitions to come and whatever derives their values (a noise seed, a key source),
derives every timed call's inputs during the first call of the block (a warm-up, untimed), solves them
there, and in each timed call only copies its prepared answer in (a copy is an allowed op).
Caught as `escape` in a sandbox (frames refused); where frames are reachable anyway, its answers are for
values no timed call ran on: each call's key is drawn after the call before it returned (`timed-output`)."""
import sys

import torch
import triton
import triton.language as tl

PLAN = {}  # entry -> the answer prepared for it


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def _solve(x, y):
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))


def _timing_frame():
    f = sys._getframe(1)
    while f is not None:
        if "order" in f.f_locals and "ts" in f.f_locals:
            return f
        f = f.f_back
    return None


def _predict(loc):
    ts = loc["ts"]
    for _, e in loc["order"]:
        if e in PLAN:
            continue
        if loc.get("noise_seed") is not None:  # values derived from the benchmark's seed: as the harness will
            values = ts.values(e, loc["noise_seed"])
        else:  # a key source: ask it for the entry's key
            values = ts.values(e, loc["key_of"](None, e))
        y = torch.empty_like(values["x"])
        _solve(values["x"], y)
        PLAN[e] = y


def run(inputs, out):
    f = _timing_frame()
    if f is not None:
        loc = f.f_locals
        _predict(loc)
        e = loc.get("j")
        if e in PLAN:
            out["y"].copy_(PLAN[e])  # no work in the timed call
            return
    _solve(inputs["x"], out["y"])
