"""Starting kernel for softmax: row-wise, numerically safe (max subtracted), two variants."""

import torch
import triton
import triton.language as tl

KNOBS = {"BLOCK_N": 256, "EVICT": "", "ROWS": 1, "VARIANT": "online", "num_stages": 1, "num_warps": 4}


@triton.jit
def _softmax_single(x_ptr, y_ptr, M, N, stride, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                    EVICT: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    for r in range(ROWS):
        row = tl.program_id(0) * ROWS + r
        if row < M:
            mask = cols < N
            x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"),
                        eviction_policy=EVICT)
            z = x - tl.max(x, axis=0)
            e = tl.exp(z)
            tl.store(y_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def _softmax_online(x_ptr, y_ptr, M, N, stride, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                    EVICT: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    for r in range(ROWS):
        row = tl.program_id(0) * ROWS + r
        if row < M:
            m = tl.full([BLOCK_N], -float("inf"), tl.float32)
            s = tl.zeros([BLOCK_N], tl.float32)
            for start in range(0, N, BLOCK_N):
                mask = start + cols < N
                x = tl.load(x_ptr + row * stride + start + cols, mask=mask, other=-float("inf"),
                        eviction_policy=EVICT)
                m_new = tl.maximum(m, x)
                # lanes that have seen only -inf keep s = 0 (avoid exp(-inf - -inf) = nan)
                alpha = tl.where(m_new == -float("inf"), 0.0, tl.exp(m - m_new))
                s = s * alpha + tl.where(mask, tl.exp(x - m_new), 0.0)
                m = m_new
            m_row = tl.max(m, axis=0)
            s_row = tl.sum(tl.where(m == -float("inf"), 0.0, s * tl.exp(m - m_row)), axis=0)
            for start in range(0, N, BLOCK_N):
                mask = start + cols < N
                x = tl.load(x_ptr + row * stride + start + cols, mask=mask, other=-float("inf"),
                        eviction_policy=EVICT)
                tl.store(y_ptr + row * stride + start + cols, tl.exp(x - m_row) / s_row, mask=mask)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    rows = KNOBS["ROWS"]
    grid = (triton.cdiv(M, rows),)
    if KNOBS["VARIANT"] == "single":
        block = max(KNOBS["BLOCK_N"], triton.next_power_of_2(N))
        kernel = _softmax_single
    else:
        block = KNOBS["BLOCK_N"]
        kernel = _softmax_online
    kernel[grid](x, y, M, N, x.stride(0), ROWS=rows, BLOCK_N=block, EVICT=KNOBS["EVICT"],
                 num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"])
