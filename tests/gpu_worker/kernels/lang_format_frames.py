"""Cheat: reads the timing code's local variables, as text, through str.format's fields on the frame of a
running generator (a format string names attributes by string: gi_frame, f_back, f_locals), so that it
could parse what the harness holds before its call (here it only keeps the text). The candidate language
has no str.format: refused at the rules as `escape`."""
import triton
import triton.language as tl

SEEN = []


@triton.jit
def k_softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def peek():
    gen = ("{0.gi_frame.f_back.f_back.f_back.f_locals}".format(gen) for _ in (0,))
    return next(gen)


def run(inputs, out):
    SEEN.append(peek())
    x, y = inputs["x"], out["y"]
    M, N = y.shape
    k_softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
