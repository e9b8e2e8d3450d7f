"""mla_decode by split-KV with the combine done by the split programs that arrive last: one launch, no
second kernel and no grid-wide barrier.

Math (spec.py): s = SCALE * q . c^T over all DL + DR columns, softmax over the S cache rows, o = p @ c[:, :DL].
The Q query tokens and H heads are M = Q*H rows sharing every cache tile.

Split phase, grid (splits * row blocks * SPLIT_DV,), the programs of one split adjacent (they run together,
all but the first read its tiles from L2). A program owns BLOCK_H rows, DV = DL / SPLIT_DV output columns
and one contiguous split of the cache, streamed in BLOCK_N-row tiles through num_stages shared-memory
buffers: scores over the program's own latent columns (the tile's V part, reused for P @ V), with SPLIT_DV 2
the other latent half (scores only) and the rope columns; online softmax in the log2 domain (fp32 running
max m and sum l); acc = acc * alpha + P @ V. It stores its normalised partial acc / l ([split, row, DL],
bf16 on the GPU) and its log2-sum-exp m + log2(l) ([dv part, split, row]: each dv part keeps the lse of its
own scores, so its weights match its partials to the last bit).

Arrival: a group is (row block, dv part), the `splits` programs that write the same output tile. After its
stores (a CTA barrier, then one acq_rel atomic add) a program takes a ticket on its group's counter. The
counter only grows (every launch adds exactly `splits`), so ticket // splits is the launch and ticket %
splits the arrival rank: no reset, CUDA graph replays need nothing. The last COMBINERS arrivals of a group
combine it; the others exit at once. A combiner waits (acquire spin) until its group's count for this launch
is complete. With the grid resident at once (GRID at most one or two programs per SM) the missing programs
are already running, so the wait is under one split's loop; the host keeps COMBINERS * groups below the
SM count (a power of two, at most the group's splits and rows), so waiting combiners never hold every slot
a missing program of a larger grid needs. Combiner j of a group reduces its j-th ROWS_C = BLOCK_H /
COMBINERS rows: w_s = 2^(lse_s - max lse) / sum, o = sum_s w_s partial_s in fp32 over the DV columns, a
[RED_S splits, ROWS_C, DV] tile per step (RED_S = COMBINE_TILE / (ROWS_C * DV), a running max across
steps; the splits axis outermost so that the warps split rows and columns and each thread sums its splits
in registers), partials read through L2 (.cg).
Under the interpreter (programs run one after another: a spin would never end) COMBINERS is 1: the last
arrival combines its whole group.

Against the starting kernel (kernel.py: split kernel + PDL combine kernel): the second launch and its
ramp go, and the combine's partial reads overlap the splits still streaming (a group's combiners start as
soon as that group is complete, not the grid). Smaller shared-memory footprints (BLOCK_N 16 at 2 stages:
q 74 KB + 2 x 18 KB) fit two programs per SM, so GRID 256 has twice the tiles in flight; PREFETCH asks L2
for the split's rows (one bulk prefetch per thread) before q loads.
"""

import math

import torch
import triton
import triton.language as tl

KNOBS = {"BLOCK_H": 64, "BLOCK_N": 32, "COMBINERS": 32, "COMBINE_TILE": 16384, "GRID": 128, "PARTIAL_BF16": True, "PREFETCH": False, "SPLIT_DV": 2, "num_stages": 4, "num_warps": 4}
KNOB_SPACE = {
    "BLOCK_H": [16, 32, 64, 128],
    "BLOCK_N": [16, 32, 64],
    "COMBINERS": [1, 4, 8, 16, 32, 64],
    "COMBINE_TILE": [4096, 8192, 16384],
    "GRID": [64, 128, 256, 512],
    "PARTIAL_BF16": [False, True],
    "PREFETCH": [False, True],
    "SPLIT_DV": [1, 2],
    "num_stages": [1, 2, 3, 4],
    "num_warps": [4, 8],
}

SCALE = 1.0 / math.sqrt(192.0)  # fixed by the problem (see spec.py)
LOG2E = 1.4426950408889634


@triton.jit
def _prefetch_l2(c_ptr, start, end, stride_cs, PF: tl.constexpr):
    """Bulk L2 prefetch of cache rows [start, end) in PF pieces, one per thread (empty pieces and addresses
    not 16-byte aligned skipped), so the rows stream from HBM while q loads."""
    rows = tl.cdiv(end - start, PF)
    r0 = start + tl.arange(0, PF) * rows
    n = tl.maximum(tl.minimum(end - r0, rows), 0)
    nbytes = (n * stride_cs * (c_ptr.dtype.element_ty.primitive_bitwidth // 8)).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b64 a; and.b64 a, $1, 15; setp.eq.s64 p, a, 0; setp.ne.and.s32 p, $2, 0, p; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [c_ptr + r0.to(tl.int64) * stride_cs, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _split_attend(
    q_ptr, c_ptr, rows, rmask, dv0, start, end, stride_qm, stride_cs, qk_scale,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT_DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN: tl.constexpr,
):
    """(acc / l [BLOCK_H, DV] over output columns dv0 .., lse = m + log2 l) of `rows` over cache rows
    [start, end), a non-empty range. The own latent columns are one tile used twice (K and V)."""
    DV: tl.constexpr = DL // SPLIT_DV
    own = dv0 + tl.arange(0, DV)
    dr = tl.arange(0, DR)
    qrow = q_ptr + rows[:, None] * stride_qm
    q_o = tl.load(qrow + own[None, :], mask=rmask[:, None], other=0.0)
    q_r = tl.load(qrow + DL + dr[None, :], mask=rmask[:, None], other=0.0)
    if SPLIT_DV == 2:
        oth = (DV - dv0) + tl.arange(0, DV)  # the other latent half: scores only
        q_x = tl.load(qrow + oth[None, :], mask=rmask[:, None], other=0.0)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + offs_n
        crow = c_ptr + n[:, None] * stride_cs
        if EVEN:  # every split is whole tiles: no masks in the hot loop
            kv = tl.load(crow + own[None, :])
            kr = tl.load(crow + DL + dr[None, :])
        else:
            nmask = n < end
            kv = tl.load(crow + own[None, :], mask=nmask[:, None], other=0.0)
            kr = tl.load(crow + DL + dr[None, :], mask=nmask[:, None], other=0.0)
        s = tl.dot(q_o, tl.trans(kv))
        if SPLIT_DV == 2:
            if EVEN:
                kx = tl.load(crow + oth[None, :])
            else:
                kx = tl.load(crow + oth[None, :], mask=nmask[:, None], other=0.0)
            s = tl.dot(q_x, tl.trans(kx), s)
        s = tl.dot(q_r, tl.trans(kr), s) * qk_scale
        if not EVEN:
            s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile visited has a valid key
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(kv.dtype), kv, acc * alpha[:, None])
        m_i = m_new
    return acc / l_i[:, None], m_i + tl.log2(l_i)


@triton.jit
def _combine_rows(
    po_ptr, plse_ptr, o_ptr, rows, cols, M, num_splits, stride_om,
    DL: tl.constexpr, DV: tl.constexpr, RED_S: tl.constexpr, ROWS_C: tl.constexpr,
):
    """o[rows, cols] = sum_s 2^(lse_s - max) partial_s / sum_s 2^(lse_s - max), RED_S splits per step with a
    running max (a step's lse and partial loads issued together). The tile is [splits, rows, columns]:
    the splits axis outermost, so the warps split the rows and each thread sums its splits in registers."""
    rmask = rows < M
    mx = tl.full([ROWS_C], float("-inf"), tl.float32)
    wsum = tl.zeros([ROWS_C], tl.float32)
    o = tl.zeros([ROWS_C, DV], tl.float32)
    for s0 in range(0, num_splits, RED_S):
        sp = s0 + tl.arange(0, RED_S)
        m2 = (sp < num_splits)[:, None] & rmask[None, :]
        idx = sp[:, None] * M + rows[None, :]  # [RED_S, ROWS_C]
        lse = tl.load(plse_ptr + idx, mask=m2, other=float("-inf"), cache_modifier=".cg")
        part = tl.load(po_ptr + idx[:, :, None] * DL + cols[None, None, :], mask=m2[:, :, None], other=0.0,
                       cache_modifier=".cg")
        lse = tl.where(rmask[None, :], lse, 0.0)  # rows past M: finite weights, never stored
        m_new = tl.maximum(mx, tl.max(lse, 0))  # finite: split 0 is never empty
        alpha = tl.exp2(mx - m_new)
        w = tl.exp2(lse - m_new[None, :])
        wsum = wsum * alpha + tl.sum(w, 0)
        o = o * alpha[:, None] + tl.sum(part.to(tl.float32) * w[:, :, None], 0)
        mx = m_new
    tl.store(o_ptr + rows[:, None] * stride_om + cols[None, :], (o / wsum[:, None]).to(o_ptr.dtype.element_ty),
             mask=rmask[:, None])


@triton.jit
def _mla_decode_arrival(
    q_ptr, c_ptr, o_ptr, po_ptr, plse_ptr, cnt_ptr,
    M, S, split_len, num_splits, stride_qm, stride_cs, stride_om, qk_scale,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT_DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN: tl.constexpr, PREFETCH: tl.constexpr, COMBINERS: tl.constexpr, RED_S: tl.constexpr,
):
    DV: tl.constexpr = DL // SPLIT_DV
    pid = tl.program_id(0)
    inner = tl.cdiv(M, BLOCK_H) * SPLIT_DV  # programs per split = groups: (row block, dv part)
    pid_s = pid // inner
    group = pid % inner
    pid_h = group // SPLIT_DV
    dv0 = (group % SPLIT_DV) * DV
    rows = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    rmask = rows < M
    start = pid_s * split_len
    end = tl.minimum(start + split_len, S)
    if PREFETCH:  # this program's 1 / inner share of the split's rows
        share = tl.cdiv(end - start, inner)
        p0 = start + group * share
        _prefetch_l2(c_ptr, p0, tl.minimum(p0 + share, end), stride_cs, 128)
    part, lse = _split_attend(q_ptr, c_ptr, rows, rmask, dv0, start, end, stride_qm, stride_cs, qk_scale,
                              DL, DR, SPLIT_DV, BLOCK_H, BLOCK_N, EVEN)
    cols = dv0 + tl.arange(0, DV)
    tl.store(po_ptr + (pid_s * M + rows[:, None]) * DL + cols[None, :], part.to(po_ptr.dtype.element_ty),
             mask=rmask[:, None])
    lse_ptr = plse_ptr + (group % SPLIT_DV) * num_splits * M  # this dv part's lse [split, row]
    tl.store(lse_ptr + pid_s * M + rows, lse, mask=rmask)

    # every thread's stores, then one release of them; the counter only grows (num_splits per launch)
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr + group, 1, sem="acq_rel")
    rank = ticket % num_splits
    if rank >= num_splits - COMBINERS:
        if COMBINERS > 1:  # wait for the rest of this launch's group (its other splits)
            target = (ticket // num_splits + 1) * num_splits
            seen = tl.atomic_add(cnt_ptr + group, 0, sem="acquire")
            while seen < target:
                seen = tl.atomic_add(cnt_ptr + group, 0, sem="acquire")
        tl.debug_barrier()  # every thread's partial loads after the acquire
        ROWS_C: tl.constexpr = BLOCK_H // COMBINERS  # combiner j of the group: its j-th ROWS_C rows
        crows = pid_h * BLOCK_H + (rank - (num_splits - COMBINERS)) * ROWS_C + tl.arange(0, ROWS_C)
        _combine_rows(po_ptr, lse_ptr, o_ptr, crows, cols, M, num_splits, stride_om, DL, DV, RED_S, ROWS_C)


_SCRATCH: dict = {}
LAUNCHED: dict = {}  # the last compiled kernel (register / spill / shared-memory reports)


def _buffers(device, m, splits, dl, sdv, groups, dtype):
    """Partials [split, row, DL], lse [dv part, split, row] and the groups' arrival counters (zeroed once)."""
    key = (str(device), m, splits, dl, sdv, groups, dtype)
    buf = _SCRATCH.get(key)
    if buf is None:
        buf = (torch.empty(splits * m * dl, device=device, dtype=dtype),
               torch.empty(sdv * splits * m, device=device, dtype=torch.float32),
               torch.zeros(groups, device=device, dtype=torch.int64))
        _SCRATCH[key] = buf
    return buf


def launch_plan(M, S, DL, sms):
    """The launch's sizes for M rows, S cache rows and DL latent columns under KNOBS; sms: the GPU's SM
    count (0 under the interpreter, where the last arrival alone combines)."""
    bn, sdv = KNOBS["BLOCK_N"], KNOBS["SPLIT_DV"]
    bh = min(KNOBS["BLOCK_H"], max(16, triton.next_power_of_2(M)))  # no block wider than the rows there are
    groups = triton.cdiv(M, bh) * sdv
    # splits from the target grid, whole BLOCK_N tiles each (the last one may be cut short by S)
    want = max(1, min(KNOBS["GRID"] // groups, triton.cdiv(S, bn)))
    split_len = triton.cdiv(triton.cdiv(S, want), bn) * bn
    splits = triton.cdiv(S, split_len)
    # waiting combiners leave an SM free (one program per SM always fits), so a missing program can run
    combiners = min(KNOBS["COMBINERS"], splits, bh, (sms - 1) // groups) if sms else 1
    combiners = 1 << (max(1, combiners).bit_length() - 1)  # a power of two: each combines bh / combiners rows
    red_s = max(1, min(triton.next_power_of_2(splits), KNOBS["COMBINE_TILE"] // (DL // sdv * (bh // combiners))))
    return {"BLOCK_H": bh, "groups": groups, "split_len": split_len, "splits": splits, "COMBINERS": combiners,
            "RED_S": red_s}


def run(inputs, out):
    q, cache, o = inputs["q"], inputs["kv_cache"], out["o"]
    Q, H, D = q.shape
    S = cache.shape[0]
    DL = o.shape[-1]
    DR = D - DL
    assert q.is_contiguous() and cache.stride(1) == 1 and o.is_contiguous()
    assert DL & (DL - 1) == 0 and DR & (DR - 1) == 0, "latent and rope widths must be powers of two"
    M = Q * H
    gpu = q.is_cuda
    plan = launch_plan(M, S, DL, torch.cuda.get_device_properties(q.device).multi_processor_count if gpu else 0)
    splits, groups, split_len = plan["splits"], plan["groups"], plan["split_len"]
    pdt = torch.bfloat16 if KNOBS["PARTIAL_BF16"] and gpu and q.dtype == torch.bfloat16 else torch.float32
    po, plse, cnt = _buffers(q.device, M, splits, DL, KNOBS["SPLIT_DV"], groups, pdt)
    prefetch = bool(KNOBS["PREFETCH"]) and gpu and cache.stride(0) * cache.element_size() % 16 == 0
    LAUNCHED["arrival"] = _mla_decode_arrival[(splits * groups,)](
        q, cache, o, po, plse, cnt, M, S, split_len, splits, D, cache.stride(0), DL, SCALE * LOG2E,
        DL=DL, DR=DR, SPLIT_DV=KNOBS["SPLIT_DV"], BLOCK_H=plan["BLOCK_H"], BLOCK_N=KNOBS["BLOCK_N"],
        EVEN=S % split_len == 0, PREFETCH=prefetch, COMBINERS=plan["COMBINERS"], RED_S=plan["RED_S"],
        num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"],
    )
