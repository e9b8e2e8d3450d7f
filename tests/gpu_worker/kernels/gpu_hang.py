"""A device-side infinite loop (GPU fault test): the kernel never finishes, so the call never returns."""

import triton
import triton.language as tl


@triton.jit
def spin(x_ptr, y_ptr):
    v = tl.load(x_ptr, volatile=True)
    while v == v:  # NaN aside, never false; the volatile reload keeps the compiler from folding it
        v = tl.load(x_ptr, volatile=True)
    tl.store(y_ptr, v)


def run(inputs, out):
    spin[(1,)](inputs["x"], out["y"])
