"""Starting kernel for mla_decode: two-kernel split-KV pipeline (Triton), written from the math.

The Q query tokens and H heads are flattened into M = Q*H independent rows (every row attends to the
whole cache with the same K/V), so a head block may span query tokens.

Kernel 1 (`_mla_decode_partial`), grid (cdiv(M, BLOCK_H), NUM_SPLITS): a program owns BLOCK_H rows and one
contiguous range of the cache (its split). It streams that range in BLOCK_N-row tiles; each latent tile
[BLOCK_N, DL] is loaded once and used twice: as K (with the rope tile [BLOCK_N, DR]) for the scores and as
V for P @ V. Scores are bf16 tl.dot with fp32 accumulation, scaled into the log2 domain; online softmax
(running max m, running sum l) in fp32. It writes the split's normalised partial output acc / l (fp32) and
its log2-sum-exp m + log2(l) (-inf for an empty split).

SPLIT_DV = 2: two programs per (head block, split), each owning 256 of the 512 output columns (half the
accumulator); both compute the same scores (1.5x FLOPs, K tile read twice from L2); only the first writes
the lse. PARTIAL_BF16: store the normalised partials in bf16 (half the partial traffic; GPU only, the
interpreter path keeps fp32).

Kernel 2 (`_mla_decode_combine`), grid (M, DL / BLOCK_D): weights w_s = 2^(lse_s - max lse) / sum, o = sum_s
w_s * partial_s, cast to the output dtype.
"""

import math

import torch
import triton
import triton.language as tl

KNOBS = {"BLOCK_H": 16, "BLOCK_N": 64, "NUM_SPLITS": 64, "PARTIAL_BF16": False, "SPLIT_DV": 1, "num_stages": 2, "num_warps": 4}

SCALE = 1.0 / math.sqrt(192.0)  # fixed by the problem (see spec.py)
LOG2E = 1.4426950408889634


@triton.jit
def _mla_decode_partial(
    q_ptr, c_ptr, po_ptr, plse_ptr,
    M, S, split_len, stride_qm, stride_cs, qk_scale,
    NUM_SPLITS: tl.constexpr, DL: tl.constexpr, DR: tl.constexpr, SPLIT_DV: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
):
    DV: tl.constexpr = DL // SPLIT_DV
    pid_h = tl.program_id(0) // SPLIT_DV
    dv0 = (tl.program_id(0) % SPLIT_DV) * DV
    pid_s = tl.program_id(1)
    rows = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    rmask = rows < M
    dl = tl.arange(0, DL)
    dr = tl.arange(0, DR)
    q_l = tl.load(q_ptr + rows[:, None] * stride_qm + dl[None, :], mask=rmask[:, None], other=0.0)
    q_r = tl.load(q_ptr + rows[:, None] * stride_qm + DL + dr[None, :], mask=rmask[:, None], other=0.0)

    start = pid_s * split_len
    end = tl.minimum(start + split_len, S)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    dv = dv0 + tl.arange(0, DV)
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + offs_n
        nmask = n < end
        kv = tl.load(c_ptr + n[:, None] * stride_cs + dl[None, :], mask=nmask[:, None], other=0.0)
        kr = tl.load(c_ptr + n[:, None] * stride_cs + DL + dr[None, :], mask=nmask[:, None], other=0.0)
        s = tl.dot(q_l, tl.trans(kv))
        s = tl.dot(q_r, tl.trans(kr), s)
        s = tl.where(nmask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has >= 1 valid column
        alpha = tl.exp2(m_i - m_new)  # exp2(-inf) = 0 on the first tile
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if SPLIT_DV == 1:
            v = kv
        else:  # this program owns output columns dv0 .. dv0 + DV: its V is that slice of the tile
            v = tl.load(c_ptr + n[:, None] * stride_cs + dv[None, :], mask=nmask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), v)
        m_i = m_new

    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    part = acc / l_safe[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(l_safe), float("-inf"))
    po = po_ptr + (rows[:, None] * NUM_SPLITS + pid_s) * DL + dv[None, :]
    tl.store(po, part.to(po_ptr.dtype.element_ty), mask=rmask[:, None])
    if dv0 == 0:
        tl.store(plse_ptr + rows * NUM_SPLITS + pid_s, lse, mask=rmask)


@triton.jit
def _mla_decode_combine(
    po_ptr, plse_ptr, o_ptr, stride_om,
    NUM_SPLITS: tl.constexpr, DL: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)
    pid_d = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    smask = sp < NUM_SPLITS
    lse = tl.load(plse_ptr + row * NUM_SPLITS + sp, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)  # finite: split 0 is never empty
    w = tl.exp2(lse - m)
    w = w / tl.sum(w, 0)
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    part = tl.load(po_ptr + (row * NUM_SPLITS + sp[:, None]) * DL + d[None, :], mask=smask[:, None], other=0.0)
    o = tl.sum(part.to(tl.float32) * w[:, None], 0)
    tl.store(o_ptr + row * stride_om + d, o.to(o_ptr.dtype.element_ty))


_SCRATCH: dict = {}
LAUNCHED: dict = {}  # the last compiled kernels (register / spill / shared-memory reports)


def _scratch(device, m, splits, dl, dtype):
    key = (str(device), m, splits, dl, dtype)
    buf = _SCRATCH.get(key)
    if buf is None:
        buf = (torch.empty(m * splits * dl, device=device, dtype=dtype),
               torch.empty(m * splits, device=device, dtype=torch.float32))
        _SCRATCH[key] = buf
    return buf


def run(inputs, out):
    q, cache, o = inputs["q"], inputs["kv_cache"], out["o"]
    Q, H, D = q.shape
    S = cache.shape[0]
    DL = o.shape[-1]
    DR = D - DL
    assert q.is_contiguous() and cache.stride(1) == 1 and o.is_contiguous()
    assert DL & (DL - 1) == 0 and DR & (DR - 1) == 0, "latent and rope widths must be powers of two"
    M = Q * H
    bh, bn, splits = KNOBS["BLOCK_H"], KNOBS["BLOCK_N"], KNOBS["NUM_SPLITS"]
    # each split covers a whole number of BLOCK_N tiles; trailing splits may be empty (lse = -inf)
    split_len = triton.cdiv(triton.cdiv(S, splits), bn) * bn
    sdv = KNOBS["SPLIT_DV"]
    # bf16 partials only where the inputs are bf16 (the interpreter runs fp32 throughout)
    pdt = torch.bfloat16 if KNOBS["PARTIAL_BF16"] and q.dtype == torch.bfloat16 else torch.float32
    po, plse = _scratch(q.device, M, splits, DL, pdt)
    LAUNCHED["partial"] = _mla_decode_partial[(triton.cdiv(M, bh) * sdv, splits)](
        q, cache, po, plse, M, S, split_len, D, cache.stride(0), SCALE * LOG2E,
        NUM_SPLITS=splits, DL=DL, DR=DR, SPLIT_DV=sdv, BLOCK_H=bh, BLOCK_N=bn,
        num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"],
    )
    block_s = triton.next_power_of_2(splits)
    block_d = min(DL, max(16, 4096 // block_s))
    LAUNCHED["combine"] = _mla_decode_combine[(M, DL // block_d)](
        po, plse, o, DL, NUM_SPLITS=splits, DL=DL, BLOCK_S=block_s, BLOCK_D=block_d, num_warps=4,
    )
