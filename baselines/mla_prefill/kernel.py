"""Starting kernel for mla_prefill: flash-style causal attention over the shared latent cache (Triton).

Grid (cdiv(H, BLOCK_H) * SPLIT_DV, cdiv(N, BLOCK_M)): a program owns BLOCK_M consecutive queries of
BLOCK_H consecutive heads (and one 1/SPLIT_DV slice of the DL output columns). Every head reads the same
cache rows under the same causal mask (it depends on the query position only), so the program stacks its
queries x heads into R = BLOCK_M * BLOCK_H rows of one score tile, query fastest (row r = query
r % BLOCK_M of head r // BLOCK_M; in offline sm_90 compiles this spilled less than head fastest), masks
each row by its own query position, and loads each cache tile once for all BLOCK_H heads. BLOCK_H = 1 is
the one-head-per-program kernel (same PTX as before the knob existed). Heads beyond H (H not a multiple of
BLOCK_H, e.g. the H = 2 CPU shape with BLOCK_H = 4) are masked on load and store; EVEN_H, a compile-time
flag, drops that mask when BLOCK_H divides H (H = 64). The head-block index varies fastest, so the programs
running together read the same cache rows (L2 reuse); query blocks are issued last-first (the causal work
of block m grows with m, so the long ones start first).

For each BLOCK_N-row tile of the cache below the block's diagonal: scores = q_lat @ tile_lat^T +
q_rope @ tile_rope^T (bf16 tl.dot, fp32 accumulation, scaled into the log2 domain), online softmax in fp32,
acc += P @ tile_lat[:, slice] (the same latent tile is the V operand). Tiles entirely below the diagonal
run without a mask; only the tiles that cross it apply the causal mask; tiles above it are never visited.

SPLIT_DV = 2 halves the fp32 accumulator (R x 512 -> R x 256, register pressure) at the price of
recomputing the scores in both programs (1.53x the FLOPs).
"""

import math

import triton
import triton.language as tl

KNOBS = {"BLOCK_H": 1, "BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_DV": 1, "num_stages": 2, "num_warps": 8}

SCALE = 1.0 / math.sqrt(192.0)  # fixed by the problem (see baselines/mla_decode/spec.py)
LOG2E = 1.4426950408889634


@triton.jit
def _tile(acc, m_i, l_i, q_l, q_r, c_ptr, n0, N, qpos, stride_cs, qk_scale, dv0,
          DL: tl.constexpr, DR: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    n = n0 + tl.arange(0, BLOCK_N)
    dl = tl.arange(0, DL)
    dr = tl.arange(0, DR)
    if CAUSAL:  # the last diagonal tile may run past the cache
        nmask = n < N
        kv = tl.load(c_ptr + n[:, None] * stride_cs + dl[None, :], mask=nmask[:, None], other=0.0)
        kr = tl.load(c_ptr + n[:, None] * stride_cs + DL + dr[None, :], mask=nmask[:, None], other=0.0)
    else:
        kv = tl.load(c_ptr + n[:, None] * stride_cs + dl[None, :])
        kr = tl.load(c_ptr + n[:, None] * stride_cs + DL + dr[None, :])
    s = tl.dot(q_l, tl.trans(kv))
    s = tl.dot(q_r, tl.trans(kr), s) * qk_scale
    if CAUSAL:
        s = tl.where(n[None, :] <= qpos[:, None], s, float("-inf"))  # per row: its query position
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DV == DL:
        v = kv
    elif CAUSAL:
        v = tl.load(c_ptr + n[:, None] * stride_cs + dv0 + tl.arange(0, DV)[None, :], mask=nmask[:, None], other=0.0)
    else:
        v = tl.load(c_ptr + n[:, None] * stride_cs + dv0 + tl.arange(0, DV)[None, :])
    acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _mla_prefill_fwd(
    q_ptr, c_ptr, o_ptr, N, H,
    stride_qn, stride_qh, stride_cs, stride_on, stride_oh, qk_scale,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, EVEN_H: tl.constexpr,
):
    DV: tl.constexpr = DL // SPLIT_DV
    R: tl.constexpr = BLOCK_M * BLOCK_H  # score-tile rows: BLOCK_M queries x BLOCK_H heads
    pid_hd = tl.program_id(0)
    hb = pid_hd // SPLIT_DV
    dv0 = (pid_hd % SPLIT_DV) * DV
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    h0 = hb * BLOCK_H  # first head of the block
    if BLOCK_H == 1:  # (spelled out so that the BLOCK_H = 1 kernel compiles exactly as before the knob)
        qpos = pid_m * BLOCK_M + tl.arange(0, R)
        hoff = tl.zeros([R], tl.int32)
    else:  # row r: query r % BLOCK_M (its causal limit), head h0 + r // BLOCK_M
        qpos = pid_m * BLOCK_M + tl.arange(0, R) % BLOCK_M
        hoff = tl.arange(0, R) // BLOCK_M
    if EVEN_H:  # H % BLOCK_H == 0 (always for BLOCK_H = 1): no head mask
        rmask = qpos < N
    else:
        rmask = (qpos < N) & (h0 + hoff < H)
    dl = tl.arange(0, DL)
    dr = tl.arange(0, DR)
    q_base = q_ptr + qpos[:, None] * stride_qn + h0 * stride_qh + hoff[:, None] * stride_qh
    q_l = tl.load(q_base + dl[None, :], mask=rmask[:, None], other=0.0)
    q_r = tl.load(q_base + DL + dr[None, :], mask=rmask[:, None], other=0.0)

    m_i = tl.full([R], float("-inf"), tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, DV], tl.float32)
    # tiles entirely at or below the first query of the block: no mask needed
    lo = (pid_m * BLOCK_M) // BLOCK_N * BLOCK_N
    for n0 in range(0, lo, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, q_l, q_r, c_ptr, n0, N, qpos, stride_cs, qk_scale, dv0,
                              DL, DR, DV, BLOCK_N, False)
    # tiles crossing the diagonal: mask j > i (also keeps j < N, since j <= i < N for stored rows);
    # the block's query range, hence lo and hi, is the same for all BLOCK_H heads
    hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
    for n0 in range(lo, hi, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, q_l, q_r, c_ptr, n0, N, qpos, stride_cs, qk_scale, dv0,
                              DL, DR, DV, BLOCK_N, True)

    acc = acc / l_i[:, None]
    o_base = o_ptr + qpos[:, None] * stride_on + h0 * stride_oh + hoff[:, None] * stride_oh + dv0
    tl.store(o_base + tl.arange(0, DV)[None, :], acc.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


LAUNCHED: dict = {}  # the last compiled kernel (register / spill / shared-memory reports)


def run(inputs, out):
    q, cache, o = inputs["q"], inputs["kv_cache"], out["o"]
    N, H, D = q.shape
    DL = o.shape[-1]
    DR = D - DL
    assert cache.shape[0] == N and q.stride(2) == 1 and cache.stride(1) == 1 and o.stride(2) == 1
    assert DL & (DL - 1) == 0 and DR & (DR - 1) == 0, "latent and rope widths must be powers of two"
    bm, bn, bh, sdv = KNOBS["BLOCK_M"], KNOBS["BLOCK_N"], KNOBS["BLOCK_H"], KNOBS["SPLIT_DV"]
    grid = (triton.cdiv(H, bh) * sdv, triton.cdiv(N, bm))
    LAUNCHED["fwd"] = _mla_prefill_fwd[grid](
        q, cache, o, N, H, q.stride(0), q.stride(1), cache.stride(0), o.stride(0), o.stride(1),
        SCALE * LOG2E, DL=DL, DR=DR, SPLIT_DV=sdv, BLOCK_M=bm, BLOCK_N=bn, BLOCK_H=bh, EVEN_H=H % bh == 0,
        num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"],
    )
