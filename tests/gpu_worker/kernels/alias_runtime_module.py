"""Cheat (escape): a module closed to candidates reached through a name bound to it, `rt = triton.runtime`,
then used as `rt.driver`: the chain would leave the rules' sight at the binding."""
import triton
import triton.language as tl

rt = triton.runtime


@triton.jit
def k_copy(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    rt.driver.active.get_current_stream()
    k_copy[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
