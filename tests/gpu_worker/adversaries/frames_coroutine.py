"""Adversary: reaches the harness's frames through a coroutine's frame (cr_frame). Caught as `escape`."""
import triton
import triton.language as tl

SEEN = []


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


async def _probe():
    return 1


def run(inputs, out):
    c = _probe()
    f = c.cr_frame
    c.close()
    while f is not None:
        SEEN.append(dict(f.f_locals))
        f = f.f_back
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
