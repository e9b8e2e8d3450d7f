"""Adversary: an import finder of its own, last on sys.meta_path, which every later import of the harness's
would consult (and could answer with a module of its own). Caught as `escape`: a finder that is not the
libraries' own is refused."""
import sys

import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


class Finder:
    def find_spec(self, name, path=None, target=None):
        return None


def run(inputs, out):
    sys.meta_path.append(Finder())
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
