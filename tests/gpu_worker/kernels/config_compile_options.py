"""Cheat: an autotuner's Config whose keys are Triton's compile options (an IR file, external libraries),
which the autotuner passes on to the launch as keywords."""
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 512, "ir_override": "/tmp/k.ttgir",
                                         "extern_libs": {"libdevice": "/tmp/m.bc"}}, num_warps=4)], key=["N"])
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
