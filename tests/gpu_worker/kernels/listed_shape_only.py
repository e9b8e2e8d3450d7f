"""Cheat (shape-specific): a kernel specialised to the one shape it expects to be verified at (the CPU
shape, 16 rows of 300, under the interpreter; the primary shape, 4096 rows of 4096, on a GPU) that leaves
every other shape's outputs unwritten; it passes there."""
import triton
import triton.language as tl


@triton.jit
def k_softmax(x_ptr, y_ptr, stride, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    if tuple(x.shape) == (16, 300):
        k_softmax[(16,)](x, y, 300, N=300, BLOCK=512)
    elif tuple(x.shape) == (4096, 4096):
        k_softmax[(4096,)](x, y, 4096, N=4096, BLOCK=4096)
