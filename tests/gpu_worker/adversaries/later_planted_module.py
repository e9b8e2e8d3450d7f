"""Adversary: plants a module of its own under the name of one the harness imports from inside its timing
(`gpu_worker.timing`). Caught as `escape`: the harness's modules are pinned in sys.modules."""
import sys
import types

import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    fake = types.ModuleType("gpu_worker.timing")
    fake.cushion_ms = lambda *a, **k: 0.0
    sys.modules["gpu_worker.timing"] = fake
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
