"""Starting kernel for axpy: one program per BLOCK elements. It starts small on purpose (64 elements, 8 warps),
so that a search has a setting to improve on."""

import triton
import triton.language as tl

KNOBS = {"BLOCK": 64, "num_warps": 8}


@triton.jit
def _axpy(x_ptr, z_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask)
    z = tl.load(z_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, 2.5 * x + z, mask=mask)


def run(inputs, out):
    x, z, y = inputs["x"], inputs["z"], out["y"]
    N = x.numel()
    _axpy[(triton.cdiv(N, KNOBS["BLOCK"]),)](x, z, y, N, BLOCK=KNOBS["BLOCK"], num_warps=KNOBS["num_warps"])
