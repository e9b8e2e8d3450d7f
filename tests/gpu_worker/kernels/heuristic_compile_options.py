"""Cheat: a heuristic whose value names, built at run time, are Triton's compile options (PTX options)."""
import triton
import triton.language as tl


def ptx(args):
    return "--allow-expensive-optimizations=false"


def blk(args):
    return triton.next_power_of_2(args["N"])


OPTION = "ptx_" + "options"


@triton.heuristics(values={"BLOCK": blk, OPTION: ptx})
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
    k_softmax[(M,)](x, y, N, x.stride(0))
