"""Starting kernel for mla_prefill: flash-style causal attention over the shared latent cache (Triton).

Grid (cdiv(H, BLOCK_H) * SPLIT_DV, cdiv(N, BLOCK_M)): a program owns BLOCK_M consecutive queries of BLOCK_H
consecutive heads and DV = DL / SPLIT_DV of the output columns. Every head reads the same cache rows under
the same causal mask (it depends on the query position only), so the program stacks its queries x heads
into R = BLOCK_M * BLOCK_H rows of one score tile, query fastest (row r = query r % BLOCK_M of head
h0 + r // BLOCK_M), masks each row by its own query position, and loads each cache tile once for all of
them. The head-block index varies fastest, so the programs running together read the same cache rows (L2
reuse); query blocks are issued last-first (the causal work of block m grows with m, so the long ones
start first and the short ones fill the tail).

Per BLOCK_N-row cache tile, in the log2 domain (qk_scale = SCALE * log2(e)):
    s   = q_own @ own^T (+ q_oth @ oth^T) + q_rope @ rope^T   bf16 dots over the 512 latent columns (own
                                                              and, with SPLIT_DV 2, other half) and the 64
                                                              rope columns, fp32 accumulator
    m'  = max(m, rowmax(s) * qk_scale);  p = exp2(s * qk_scale - m');  alpha = exp2(m - m')
    acc = tl.dot(p.to(bf16), own, acc * alpha)                the own latent columns are also V; the dot
    l   = l * alpha + rowsum(p)                               accumulates into the rescaled acc in place
A tile is 576 columns of shared memory whatever SPLIT_DV is (own + other + rope). Tiles wholly at or below
the block's first query run without any mask; only the tiles that cross the diagonal (ceil(BLOCK_M /
BLOCK_N) + 1 at most) mask j > i; tiles above it are never visited. Masked scores are -inf, and every row
sees cache row 0 in its first tile, so m' is finite from then on and exp2 never sees (-inf) - (-inf).
TMA: cache tiles by tensor descriptors that the kernel builds (TMA copies into shared memory, no
per-element addresses; rows past the cache read as zeros; Triton takes 128 B of global scratch per
descriptor and program from the allocator run() sets); otherwise by pointers (cp.async, masked on the
diagonal tiles). A cache that is not 16-byte aligned goes by pointers whatever TMA says.

Why 2 heads x 64 queries, SPLIT_DV 2 at 8 warps by default. Triton lays a dot whose result feeds another
dot out with all warps along the rows, and a warp group's wgmma takes 64 rows, so with 8 warps (two warp
groups):
  * R = 64 (one head): both warp groups compute the same 64 x BLOCK_N scores, then each takes 256 output
    columns: the scores' FLOPs twice per program;
  * R = 128 with DV = 512: each warp group owns 64 rows and a 64 x 512 fp32 accumulator, 256 registers per
    thread: it cannot fit;
  * R = 128 with SPLIT_DV 2 (the default): each warp group owns 64 rows x 256 columns (128 accumulator
    registers); the two column halves' programs each compute the scores.
Either way the scores are computed twice: 2 * 576 + 512 = 1664 multiply-adds per causal pair and head
against 1088, 1.53x the problem's FLOPs. The default trades the first layout's in-program duplication for
two warp groups on different rows (their softmax and wgmma interleave) that share each cache tile.

Resources (bf16 = 2 B; the H200 allows 227 KiB = 232448 B of shared memory per program, 64K registers):
  q            R x 576 bf16 = 1152 * R B of shared memory, resident all loop long (144 KiB at R = 128);
  cache tiles  BLOCK_N x 576 bf16 per pipeline stage: 36 / 72 KiB at BLOCK_N 32 / 64 (+1 KiB of barriers
               with TMA);
  accumulator  R x DV fp32 in registers: R * DV / (32 * num_warps) per thread (128 at R 128, DV 256, 8 warps);
  scores       R x BLOCK_N fp32: R * BLOCK_N / (32 * num_warps) per thread (16 at the defaults).
Offline sm_90 compiles (Triton 3.9, scripts/offline_compile_mla_prefill.py): the defaults take 144 + 2 x 36
= 216 KiB (221184 B) of shared memory and 225 registers, no spills (by TMA 222208 B, 228 registers); 4
heads x 32 queries 196 registers. The one-head layout (SPLIT_DV 1, BLOCK_N 64, 8 warps) takes 255 registers
and spills 72 B; 4 warps at R = 128 spill 3.8 KB.
"""

import math

import torch
import triton
import triton.language as tl

KNOBS = {"BLOCK_H": 2, "BLOCK_M": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "TMA": False, "num_stages": 2, "num_warps": 8}

SCALE = 1.0 / math.sqrt(192.0)  # fixed by the problem (see baselines/mla_decode/spec.py)
LOG2E = 1.4426950408889634


@triton.jit
def _tile(acc, m_i, l_i, q_o, q_x, q_r, c_ptr, kv_desc, kr_desc, n0, N, qpos, dv0, own, oth, stride_cs, qk_scale,
          DL: tl.constexpr, DR: tl.constexpr, SPLIT_DV: tl.constexpr, BLOCK_N: tl.constexpr,
          DIAGONAL: tl.constexpr, TMA: tl.constexpr):
    n = n0 + tl.arange(0, BLOCK_N)
    if TMA:  # rows past the cache come back as zeros
        kv = kv_desc.load([n0, dv0])
        kr = kr_desc.load([n0, DL])
        if SPLIT_DV == 2:
            kx = kv_desc.load([n0, DL // 2 - dv0])
    else:
        row = c_ptr + n[:, None] * stride_cs
        if DIAGONAL:  # the last diagonal tile may run past the cache
            nmask = (n < N)[:, None]
            kv = tl.load(row + own[None, :], mask=nmask, other=0.0)
            kr = tl.load(row + DL + tl.arange(0, DR)[None, :], mask=nmask, other=0.0)
            if SPLIT_DV == 2:
                kx = tl.load(row + oth[None, :], mask=nmask, other=0.0)
        else:
            kv = tl.load(row + own[None, :])
            kr = tl.load(row + DL + tl.arange(0, DR)[None, :])
            if SPLIT_DV == 2:
                kx = tl.load(row + oth[None, :])
    s = tl.dot(q_o, tl.trans(kv))
    if SPLIT_DV == 2:
        s = tl.dot(q_x, tl.trans(kx), s)
    s = tl.dot(q_r, tl.trans(kr), s)
    if DIAGONAL:
        s = tl.where(n[None, :] <= qpos[:, None], s, float("-inf"))  # per row: its query position
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(kv.dtype), kv, acc * alpha[:, None])  # the rescaled acc is the dot's accumulator
    return acc, m_new, l_i


@triton.jit
def _mla_prefill_fwd(
    q_ptr, c_ptr, o_ptr, N, H,
    stride_qn, stride_qh, stride_cs, stride_on, stride_oh, qk_scale,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, EVEN_H: tl.constexpr,
    TMA: tl.constexpr,
):
    tl.static_assert(SPLIT_DV == 1 or SPLIT_DV == 2)
    DV: tl.constexpr = DL // SPLIT_DV
    R: tl.constexpr = BLOCK_M * BLOCK_H  # score-tile rows: BLOCK_M queries x BLOCK_H heads
    h0 = (tl.program_id(0) // SPLIT_DV) * BLOCK_H  # first head of the block
    dv0 = (tl.program_id(0) % SPLIT_DV) * DV  # first output column
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)  # the longest causal rows first
    r = tl.arange(0, R)
    qpos = pid_m * BLOCK_M + r % BLOCK_M
    hoff = r // BLOCK_M
    if EVEN_H:  # H % BLOCK_H == 0: no head mask
        rmask = qpos < N
    else:
        rmask = (qpos < N) & (h0 + hoff < H)
    own = dv0 + tl.arange(0, DV)  # this program's output columns: K for the scores and V
    oth = (DV - dv0) + tl.arange(0, DV)  # SPLIT_DV 2: the other latent half (scores only)
    q_row = q_ptr + qpos[:, None] * stride_qn + (h0 + hoff)[:, None] * stride_qh
    q_o = tl.load(q_row + own[None, :], mask=rmask[:, None], other=0.0)
    q_r = tl.load(q_row + DL + tl.arange(0, DR)[None, :], mask=rmask[:, None], other=0.0)
    q_x = q_o
    if SPLIT_DV == 2:
        q_x = tl.load(q_row + oth[None, :], mask=rmask[:, None], other=0.0)

    kv_desc = c_ptr  # (both unused by pointers)
    kr_desc = c_ptr
    if TMA:  # the latent halves and the rope columns of the cache, BLOCK_N rows at a time
        kv_desc = tl.make_tensor_descriptor(c_ptr, shape=[N, DL + DR], strides=[stride_cs, 1],
                                            block_shape=[BLOCK_N, DV])
        kr_desc = tl.make_tensor_descriptor(c_ptr, shape=[N, DL + DR], strides=[stride_cs, 1],
                                            block_shape=[BLOCK_N, DR])

    m_i = tl.full([R], float("-inf"), tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, DV], tl.float32)
    # tiles entirely at or below the first query of the block: no mask
    lo = (pid_m * BLOCK_M) // BLOCK_N * BLOCK_N
    for n0 in tl.range(0, lo, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, q_o, q_x, q_r, c_ptr, kv_desc, kr_desc, n0, N, qpos, dv0, own, oth,
                              stride_cs, qk_scale, DL, DR, SPLIT_DV, BLOCK_N, False, TMA)
    # tiles crossing the diagonal: mask j > i (and j >= N: past the last query, so j > i already)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
    for n0 in tl.range(lo, hi, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, q_o, q_x, q_r, c_ptr, kv_desc, kr_desc, n0, N, qpos, dv0, own, oth,
                              stride_cs, qk_scale, DL, DR, SPLIT_DV, BLOCK_N, True, TMA)

    acc = acc / l_i[:, None]
    o_row = o_ptr + qpos[:, None] * stride_on + (h0 + hoff)[:, None] * stride_oh
    tl.store(o_row + own[None, :], acc.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


LAUNCHED: dict = {}  # the last compiled kernel (register / spill / shared-memory reports)


def descriptor_ok(t) -> bool:
    """A tensor descriptor needs a 16-byte aligned base and row stride; any other cache goes by pointers.
    torch aligns allocations far past 16 B, so a contiguous cache of 16-byte rows is aligned unless it is
    a view cut from a larger buffer at an odd element (not checked: candidates may not read data_ptr)."""
    return t.is_contiguous() and t.stride(0) * t.element_size() % 16 == 0


def run(inputs, out):
    q, cache, o = inputs["q"], inputs["kv_cache"], out["o"]
    N, H, D = q.shape
    DL = o.shape[-1]
    DR = D - DL
    assert cache.shape[0] == N and q.stride(2) == 1 and cache.stride(1) == 1 and o.stride(2) == 1
    assert DL & (DL - 1) == 0 and DR & (DR - 1) == 0, "latent and rope widths must be powers of two"
    bm, bn, bh, sdv = KNOBS["BLOCK_M"], KNOBS["BLOCK_N"], KNOBS["BLOCK_H"], KNOBS["SPLIT_DV"]
    grid = (triton.cdiv(H, bh) * sdv, triton.cdiv(N, bm))
    tma = KNOBS["TMA"] and descriptor_ok(cache)
    if tma:  # the kernel builds its descriptors in global scratch that Triton takes from this allocator
        def scratch(size, alignment, stream):
            return torch.empty(size, device=cache.device, dtype=torch.int8)

        triton.set_allocator(scratch)
    LAUNCHED["fwd"] = _mla_prefill_fwd[grid](
        q, cache, o, N, H, q.stride(0), q.stride(1), cache.stride(0), o.stride(0), o.stride(1),
        SCALE * LOG2E, DL=DL, DR=DR, SPLIT_DV=sdv, BLOCK_M=bm, BLOCK_N=bn, BLOCK_H=bh, EVEN_H=H % bh == 0,
        TMA=tma,
        num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"],
    )
