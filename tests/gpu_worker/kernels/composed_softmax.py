"""Cheat (library-kernel): a Triton kernel does the normalisation, torch does the exponentials in run()."""
import torch
import triton
import triton.language as tl


@triton.jit
def k_normalise(e_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    e = tl.load(e_ptr + row * stride + cols, mask=cols < N, other=0.0)
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = y.shape
    e = torch.exp(x - x.amax(-1, keepdim=True)).contiguous()
    k_normalise[(M,)](e, y, N, e.stride(0), BLOCK=triton.next_power_of_2(N))
