"""An autotuned Triton kernel with two configs, for the autotuning-choices tests (run under the interpreter,
which cannot benchmark: a call whose key has no choice fails there)."""

import triton
import triton.language as tl

CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=2)]


@triton.autotune(configs=CONFIGS, key=["N"])
@triton.jit
def double(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)


def run(x):
    import torch

    y = torch.empty_like(x)
    double[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
    return y
