"""Adversary: reaches the timing loop's frame through a generator's frame (gi_frame, then f_back), to read
the benchmark's noise seed, the timed entries to come and the timing set, and answer them ahead.
Caught as `escape`: candidate code may not read a generator's frame (the guard's audit hook)."""
import triton
import triton.language as tl

SEEN = {}


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def _probe():
    yield 1


def run(inputs, out):
    g = _probe()
    f = g.gi_frame.f_back  # the generator's frame: f_back is this call's frame while it runs
    while f is not None:
        for name in ("noise_seed", "key_of", "order", "ts", "entries"):
            if name in f.f_locals:
                SEEN[name] = f.f_locals[name]
        f = f.f_back
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    softmax_rows[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
