"""A starting kernel for tests/baselines/files/layernorm.py that the search policy can tune: ROWS rows a
program (it starts at one, so a search has a setting to improve on), the affine applied."""

import triton
import triton.language as tl

KNOBS = {"ROWS": 1, "num_warps": 4}
KNOB_SPACE = {"ROWS": [1, 2, 4, 8], "num_warps": [1, 2, 4, 8]}


@triton.jit
def _layernorm_rows(x_ptr, w_ptr, b_ptr, y_ptr, M, N, stride, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * stride + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    mean = tl.sum(x, axis=1) / N
    d = tl.where(mask, x - mean[:, None], 0.0)
    r = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / N + eps)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0)
    b = tl.load(b_ptr + cols, mask=cols < N, other=0.0)
    tl.store(y_ptr + offs, d * r[:, None] * w[None, :] + b[None, :], mask=mask)


def run(inputs, out):
    x, w, b, y = inputs["in0"], inputs["ln.weight"], inputs["ln.bias"], out["out0"]
    M, N = x.shape
    _layernorm_rows[(triton.cdiv(M, KNOBS["ROWS"]),)](x, w, b, y, M, N, x.stride(0), 1e-5, ROWS=KNOBS["ROWS"],
                                                      BLOCK=triton.next_power_of_2(N), num_warps=KNOBS["num_warps"])
