"""Cheat: a descriptor declared in a class body (a property whose getter is a bound str.format) reads a
running generator's caller frames by attribute names given as a string, whenever the attribute is read.
The candidate language has no classes and no property: refused at the rules as `escape`."""
import triton
import triton.language as tl


class Peek:
    callers = property("{0.gen.gi_frame.f_back.f_back.f_locals}".format)

    def __init__(self):
        self.gen = (self.callers for _ in (0,))


@triton.jit
def k_softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    text = next(Peek().gen)
    x, y = inputs["x"], out["y"]
    M, N = y.shape
    k_softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N) if text else 16)
