"""Starting kernel for mla_decode: split-KV decode (Triton). Each program streams one contiguous range of
the cache (its split) through a software pipeline for a block of rows, and a small combine merges the
splits; or (knob FUSED) the same programs merge them themselves behind a grid-wide barrier.

The Q query tokens and H heads are flattened into M = Q*H independent rows: every row attends to the whole
cache with the same K/V, so the rows of all query tokens share every cache tile.

Split programs (`_mla_decode_split`, grid (row blocks * SPLIT_DV, splits), the programs of one split
adjacent so that they run together and all but the first read its tiles from L2). A program owns BLOCK_H
rows, DL / SPLIT_DV output columns and one split of the cache, streamed in BLOCK_N-row tiles with
num_stages shared-memory buffers (num_stages - 1 tiles in flight while one is computed). Per tile
(`_attend_range`): scores = q . K^T over all DL + DR columns (bf16 tl.dot, fp32 accumulation, log2
domain), online softmax (running max m, running sum l, fp32), acc = acc * alpha + P @ V. The latent tile
is loaded once as two parts, the program's own output columns (K for the scores and, unchanged, V for
P @ V) and with SPLIT_DV 2 the other half (scores only), plus the rope columns: a tile is DL + DR columns
of shared memory whatever SPLIT_DV is. Where every split is whole tiles inside the cache (EVEN) the loop
has no masks. A program writes its normalised partial acc / l (bf16 on the GPU) and its log2-sum-exp
m + log2(l), laid out [split, row, DL] so that each program writes one contiguous block.

PREFETCH (GPU only: inline PTX): before it loads q, each program asks L2 for its share of its split's
rows (the split is one contiguous byte range; the row block x dv programs of a split each take 1 / their
number) with `cp.async.bulk.prefetch.L2`, so the whole cache streams from HBM from the first instruction
on, while q loads. Without it the compiled code loads q (global -> registers -> shared memory) before the
pipeline's first tile copies are issued (sm_90 PTX, Triton 3.9), so the first tiles' HBM latency follows
q's, and with num_stages - 1 tiles in flight a program's later tiles wait a second HBM round trip.

Why SPLIT_DV 2 with 4 warps by default: a warp group's wgmma takes 64 rows, and a 64 x 512 fp32 accumulator
does not fit 4 warps' registers, while with 8 warps Triton (3.9, offline sm_90 compile) lays the 64-row
score tile over both warp groups and computes it twice, at half the instruction width (each instruction
re-reads its q slice from shared memory: narrow instructions make the scores shared-memory bound). One warp
group per program, owning 256 output columns, computes its 64 x BLOCK_N scores once with full-width
instructions; the two programs of a split both compute them (1.53x the FLOPs of the split, none duplicated
inside a program) and read the tile once each (the second from L2). BLOCK_H 128 with 8 warps gives each
warp group its own 64 rows of one program (one tile read for 128 rows).

Splits: GRID / (row blocks * SPLIT_DV) (about one program per SM), each at least MIN_TILES whole BLOCK_N
tiles (the last split may be cut short by S). With the defaults Q1 (64 rows: one row block) runs 64 splits
of 128 keys and Q4 (256 rows: 4 row blocks) 16 splits of 512 keys, 128 programs each; the partials are
M * splits * DL bf16 elements (4.2 MB in both), against the 9.4 MB cache.

Row blocks: BLOCK_H rows (16/32: mma.sync; 64/128: wgmma), shrunk for small M until there are MIN_ROW_BLOCKS
blocks (16 minimum).

Combine (`_mla_decode_combine`), grid (M, DL / BLOCK_D), BLOCK_D = COMBINE_TILE / splits: weights
w_s = 2^(lse_s - max lse) / sum, o = sum_s w_s * partial_s in fp32, cast to the output dtype. PDL launches
it as a programmatic dependent of the split kernel (which signals after its stores; the combine waits in
griddepcontrol.wait until the split kernel's writes are visible).

FUSED (`_mla_decode_fused`, one launch, grid (splits * row blocks * SPLIT_DV,), the split's programs
adjacent): phase 1 is the split programs' loop; its partials are laid out [row, split, DL] (one row's
splits contiguous) with the lse [row, split]. Then every program adds 1 to an int64 arrival counter
(acq_rel, after a CTA barrier so that all its threads' stores are released) and, on the GPU, spins until
this launch's arrivals are complete: the counter only grows (each launch adds exactly nprog, one counter per
grid size), so launch k waits for (k + 1) * nprog and nothing is ever reset. The wait needs every program
resident at once: the grid is capped at the SM count (one program per SM always fits) and a larger grid
falls back to the path below. Phase 2: each program reduces items of RED_R rows x REDUCE_D columns,
strided over the grid, RED_S splits per step (RED_S = COMBINE_TILE / REDUCE_D, at most the splits) with a
running max: a step loads its [RED_R, RED_S] lse and [RED_R, RED_S, REDUCE_D] partials together, so an item
whose splits fit one step is one round trip to L2. RED_R: as many rows as the COMBINE_TILE holds, but no
fewer items than programs. With REDUCE_D 256 and COMBINE_TILE 16384 every item is one step: Q1 (64 splits)
one row x 256 columns per program, Q4 (16 splits) 4 rows x 256 columns per program. Off the GPU (the
interpreter runs programs one after another, a spin would never end) and for a grid over the SM count, the
last program to arrive reduces every item.
"""

import math

import torch
import triton
import triton.language as tl

KNOBS = {"BLOCK_H": 64, "BLOCK_N": 32, "COMBINE_TILE": 8192, "FUSED": False, "GRID": 128, "MIN_ROW_BLOCKS": 1, "MIN_TILES": 1, "PARTIAL_BF16": True, "PDL": True, "PREFETCH": False, "REDUCE_D": 512, "SPLIT_DV": 2, "num_stages": 4, "num_warps": 4}

SCALE = 1.0 / math.sqrt(192.0)  # fixed by the problem (see spec.py)
LOG2E = 1.4426950408889634


@triton.jit
def _attend_range(
    q_ptr, c_ptr, rows, rmask, dv0, start, end, stride_qm, stride_cs, qk_scale,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT_DV: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr,
):
    """Online softmax of `rows` over cache rows [start, end) (log2 domain): (acc [BLOCK_H, DL / SPLIT_DV] over
    the output columns dv0 .., running max m, running sum l). The latent columns are read as this program's
    own DV columns (K for the scores and V for P @ V: one shared-memory tile, two uses) and, with SPLIT_DV 2,
    the other half (scores only), so a tile's bytes are DL + DR columns whatever SPLIT_DV is."""
    tl.static_assert(SPLIT_DV == 1 or SPLIT_DV == 2)
    DV: tl.constexpr = DL // SPLIT_DV
    own = dv0 + tl.arange(0, DV)
    dr = tl.arange(0, DR)
    q_o = tl.load(q_ptr + rows[:, None] * stride_qm + own[None, :], mask=rmask[:, None], other=0.0)
    q_r = tl.load(q_ptr + rows[:, None] * stride_qm + DL + dr[None, :], mask=rmask[:, None], other=0.0)
    if SPLIT_DV == 2:
        oth = (DV - dv0) + tl.arange(0, DV)  # the other half of the latent columns
        q_x = tl.load(q_ptr + rows[:, None] * stride_qm + oth[None, :], mask=rmask[:, None], other=0.0)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + offs_n
        if EVEN:  # every split is whole tiles inside the cache: no masks in the hot loop
            kv = tl.load(c_ptr + n[:, None] * stride_cs + own[None, :])
            kr = tl.load(c_ptr + n[:, None] * stride_cs + DL + dr[None, :])
        else:
            nmask = n < end
            kv = tl.load(c_ptr + n[:, None] * stride_cs + own[None, :], mask=nmask[:, None], other=0.0)
            kr = tl.load(c_ptr + n[:, None] * stride_cs + DL + dr[None, :], mask=nmask[:, None], other=0.0)
        if SPLIT_DV == 2:
            if EVEN:
                kx = tl.load(c_ptr + n[:, None] * stride_cs + oth[None, :])
            else:
                kx = tl.load(c_ptr + n[:, None] * stride_cs + oth[None, :], mask=nmask[:, None], other=0.0)
        s = tl.dot(q_o, tl.trans(kv))
        if SPLIT_DV == 2:
            s = tl.dot(q_x, tl.trans(kx), s)
        s = tl.dot(q_r, tl.trans(kr), s)
        s = s * qk_scale
        if not EVEN:
            s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every visited tile has >= 1 valid key
        alpha = tl.exp2(m_i - m_new)  # exp2(-inf) = 0 on the first tile
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(kv.dtype), kv, acc * alpha[:, None])  # the rescaled acc is the dot's accumulator
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _prefetch_l2(c_ptr, start, end, stride_cs, PF: tl.constexpr):
    """Bulk L2 prefetch of cache rows [start, end), one contiguous byte range: PF pieces of about
    (end - start) / PF rows, one per thread (empty pieces and addresses not 16-byte aligned skipped). Issued
    before q loads, so the range streams from HBM while q does and the pipeline's tile copies find it in L2."""
    rows = tl.cdiv(end - start, PF)
    r0 = start + tl.arange(0, PF) * rows
    n = tl.maximum(tl.minimum(end - r0, rows), 0)
    nbytes = (n * stride_cs * (c_ptr.dtype.element_ty.primitive_bitwidth // 8)).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b64 a; and.b64 a, $1, 15; setp.eq.s64 p, a, 0; setp.ne.and.s32 p, $2, 0, p; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [c_ptr + r0.to(tl.int64) * stride_cs, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _split_partial(
    q_ptr, c_ptr, rows, rmask, dv0, start, end, share_idx, n_share, stride_qm, stride_cs, qk_scale,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT_DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN: tl.constexpr, PREFETCH: tl.constexpr,
):
    """One split program's normalised partial acc / l [BLOCK_H, DL / SPLIT_DV] and log2-sum-exp m + log2(l)
    (-inf for an empty split). With PREFETCH the n_share programs reading this split first ask L2 for one
    n_share-th of its rows each (share share_idx)."""
    if PREFETCH:
        share = tl.cdiv(end - start, n_share)
        p0 = start + share_idx * share
        _prefetch_l2(c_ptr, p0, tl.minimum(p0 + share, end), stride_cs, 128)
    acc, m_i, l_i = _attend_range(q_ptr, c_ptr, rows, rmask, dv0, start, end, stride_qm, stride_cs, qk_scale,
                                  DL, DR, SPLIT_DV, BLOCK_H, BLOCK_N, EVEN)
    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    lse = tl.where(nonempty, m_i + tl.log2(l_safe), float("-inf"))
    return acc / l_safe[:, None], lse


@triton.jit
def _mla_decode_split(
    q_ptr, c_ptr, po_ptr, plse_ptr,
    M, S, split_len, stride_qm, stride_cs, qk_scale,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT_DV: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
):
    DV: tl.constexpr = DL // SPLIT_DV
    pid_h = tl.program_id(0) // SPLIT_DV
    dv0 = (tl.program_id(0) % SPLIT_DV) * DV
    pid_s = tl.program_id(1)
    rows = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    rmask = rows < M
    start = pid_s * split_len
    end = tl.minimum(start + split_len, S)
    part, lse = _split_partial(q_ptr, c_ptr, rows, rmask, dv0, start, end, tl.program_id(0), tl.num_programs(0),
                               stride_qm, stride_cs, qk_scale, DL, DR, SPLIT_DV, BLOCK_H, BLOCK_N, EVEN, PREFETCH)
    dv = dv0 + tl.arange(0, DV)
    po = po_ptr + (pid_s * M + rows[:, None]) * DL + dv[None, :]
    tl.store(po, part.to(po_ptr.dtype.element_ty), mask=rmask[:, None])
    if dv0 == 0:
        tl.store(plse_ptr + pid_s * M + rows, lse, mask=rmask)
    if PDL:  # after the stores: the combine may launch once every program got here (it still waits for them)
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _mla_decode_combine(
    po_ptr, plse_ptr, o_ptr, M, num_splits, stride_om,
    DL: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    row = tl.program_id(0)
    pid_d = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    smask = sp < num_splits
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    if PDL:  # launched early as a dependent of kernel 1: its partials are visible only after this
        tl.extra.cuda.gdc_wait()
    # both loads issued before the weights' reductions, so their latencies overlap
    part = tl.load(po_ptr + (sp[:, None] * M + row) * DL + d[None, :], mask=smask[:, None], other=0.0)
    lse = tl.load(plse_ptr + sp * M + row, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)  # finite: split 0 is never empty
    w = tl.exp2(lse - m)
    w = w / tl.sum(w, 0)
    o = tl.sum(part.to(tl.float32) * w[:, None], 0)
    tl.store(o_ptr + row * stride_om + d, o.to(o_ptr.dtype.element_ty))


@triton.jit
def _mla_decode_fused(
    q_ptr, c_ptr, o_ptr, po_ptr, plse_ptr, cnt_ptr,
    M, S, split_len, num_splits, stride_qm, stride_cs, stride_om, qk_scale,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT_DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN: tl.constexpr, PREFETCH: tl.constexpr, BARRIER: tl.constexpr,
    RED_R: tl.constexpr, RED_S: tl.constexpr, RED_D: tl.constexpr,
):
    DV: tl.constexpr = DL // SPLIT_DV
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    inner = tl.cdiv(M, BLOCK_H) * SPLIT_DV  # programs per split: (row block, dv part), fastest in the grid
    pid_s = pid // inner
    pid_h = (pid % inner) // SPLIT_DV
    dv0 = (pid % SPLIT_DV) * DV
    rows = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    rmask = rows < M

    # ---- phase 1: this program's split of the cache ----
    start = pid_s * split_len
    end = tl.minimum(start + split_len, S)
    part, lse = _split_partial(q_ptr, c_ptr, rows, rmask, dv0, start, end, pid % inner, inner, stride_qm,
                               stride_cs, qk_scale, DL, DR, SPLIT_DV, BLOCK_H, BLOCK_N, EVEN, PREFETCH)
    dv = dv0 + tl.arange(0, DV)
    # partials laid out [row, split, DL]: one row's splits are contiguous for the reduction below
    tl.store(po_ptr + (rows[:, None] * num_splits + pid_s) * DL + dv[None, :], part.to(po_ptr.dtype.element_ty),
             mask=rmask[:, None])
    if dv0 == 0:
        tl.store(plse_ptr + rows * num_splits + pid_s, lse, mask=rmask)

    # ---- arrival: every thread's stores, then one release of them (the counter only ever grows) ----
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
    n_chunks: tl.constexpr = DL // RED_D
    n_items = tl.cdiv(M, RED_R) * n_chunks
    if BARRIER:  # every program is resident (grid <= SMs): wait for this launch's nprog arrivals
        target = (ticket // nprog + 1) * nprog
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
        while seen < target:
            seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
        tl.debug_barrier()
        first = pid
        step = nprog
    else:  # programs may run one after another (interpreter, oversized grid): the last arrival reduces all
        first = tl.where(ticket % nprog == nprog - 1, 0, n_items)
        step = 1

    # ---- phase 2: o[rows, cols] = sum_s 2^(lse_s - mx) * part_s / sum_s 2^(lse_s - mx), one item of RED_R rows
    # x RED_D columns at a time, RED_S splits per step with a running max: each step's lse and partial loads
    # are issued together, so an item whose splits fit one step costs one round trip to L2.
    for it in range(first, n_items, step):
        r = (it // n_chunks) * RED_R + tl.arange(0, RED_R)
        rm = r < M
        d = (it % n_chunks) * RED_D + tl.arange(0, RED_D)
        mx = tl.full([RED_R], float("-inf"), tl.float32)
        wsum = tl.zeros([RED_R], tl.float32)
        o2 = tl.zeros([RED_R, RED_D], tl.float32)
        for s0 in range(0, num_splits, RED_S):
            sp = s0 + tl.arange(0, RED_S)
            smask = sp < num_splits
            lse_t = tl.load(plse_ptr + r[:, None] * num_splits + sp[None, :], mask=rm[:, None] & smask[None, :],
                            other=float("-inf"))
            part_t = tl.load(po_ptr + (r[:, None, None] * num_splits + sp[None, :, None]) * DL + d[None, None, :],
                             mask=(rm[:, None] & smask[None, :])[:, :, None], other=0.0)
            lse_t = tl.where(rm[:, None], lse_t, 0.0)  # rows past M: finite weights, never stored
            m_new = tl.maximum(mx, tl.max(lse_t, 1))  # finite: split 0 is never empty
            alpha = tl.exp2(mx - m_new)  # 0 on the first step
            w = tl.exp2(lse_t - m_new[:, None])
            wsum = wsum * alpha + tl.sum(w, 1)
            o2 = o2 * alpha[:, None] + tl.sum(part_t.to(tl.float32) * w[:, :, None], 1)
            mx = m_new
        o = o2 / wsum[:, None]
        tl.store(o_ptr + r[:, None] * stride_om + d[None, :], o.to(o_ptr.dtype.element_ty), mask=rm[:, None])


_SCRATCH: dict = {}
LAUNCHED: dict = {}  # the last compiled kernels (register / spill / shared-memory reports)


def _scratch(device, m, splits, dl, dtype):
    key = (str(device), m, splits, dl, dtype)
    buf = _SCRATCH.get(key)
    if buf is None:
        buf = (torch.empty(splits * m * dl, device=device, dtype=dtype),
               torch.empty(splits * m, device=device, dtype=torch.float32))
        _SCRATCH[key] = buf
    return buf


def _counter(device, nprog):
    """The fused kernel's arrival counter: one per grid size, zeroed once; every launch adds exactly nprog."""
    key = ("counter", str(device), nprog)
    buf = _SCRATCH.get(key)
    if buf is None:
        buf = torch.zeros(1, device=device, dtype=torch.int64)
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
    bn, sdv = KNOBS["BLOCK_N"], KNOBS["SPLIT_DV"]
    bh = min(KNOBS["BLOCK_H"], max(16, triton.next_power_of_2(M)))  # no block wider than the rows there are
    if KNOBS["MIN_ROW_BLOCKS"] > 1:  # few rows (Q = 1): smaller row blocks (powers of two >= 16, for tl.dot)
        bh = min(bh, max(16, 1 << max(0, (M // KNOBS["MIN_ROW_BLOCKS"]).bit_length() - 1)))
    row_blocks = triton.cdiv(M, bh)
    gpu = q.is_cuda  # bf16 partials, PDL and the grid barrier on the GPU only (the interpreter runs fp32 on the CPU)
    grid = KNOBS["GRID"]
    if KNOBS["FUSED"] and gpu:  # the fused kernel's barrier needs every program resident: at most one per SM
        grid = min(grid, torch.cuda.get_device_properties(q.device).multi_processor_count)
    # splits from the target grid, each at least MIN_TILES whole BLOCK_N tiles (the last one may be cut short
    # by S): a program's tiles are what the pipeline overlaps, and the partials grow with the splits
    want = max(1, min(grid // (row_blocks * sdv), triton.cdiv(S, bn * KNOBS["MIN_TILES"])))
    split_len = triton.cdiv(triton.cdiv(S, want), bn) * bn
    splits = triton.cdiv(S, split_len)
    even = S % split_len == 0
    pdt = torch.bfloat16 if KNOBS["PARTIAL_BF16"] and gpu and q.dtype == torch.bfloat16 else torch.float32
    po, plse = _scratch(q.device, M, splits, DL, pdt)
    # inline PTX, compiled code only; the bulk prefetch takes sizes of 16-byte multiples (and skips itself
    # where the address is not 16-byte aligned)
    prefetch = bool(KNOBS["PREFETCH"]) and gpu and cache.stride(0) * cache.element_size() % 16 == 0
    if KNOBS["FUSED"]:
        nprog = row_blocks * sdv * splits
        red_d = min(DL, KNOBS["REDUCE_D"])
        red_s = max(2, min(triton.next_power_of_2(splits), KNOBS["COMBINE_TILE"] // red_d))
        # rows per reduction item: as many as the tile holds, but no fewer items than programs
        red_r = max(1, min(KNOBS["COMBINE_TILE"] // (red_s * red_d), M * (DL // red_d) // nprog,
                           triton.next_power_of_2(M)))
        red_r = 1 << (red_r.bit_length() - 1)
        LAUNCHED["fused"] = _mla_decode_fused[(nprog,)](
            q, cache, o, po, plse, _counter(q.device, nprog), M, S, split_len, splits, D, cache.stride(0), DL,
            SCALE * LOG2E, DL=DL, DR=DR, SPLIT_DV=sdv, BLOCK_H=bh, BLOCK_N=bn, EVEN=even, PREFETCH=prefetch,
            BARRIER=gpu and nprog <= grid, RED_R=red_r, RED_S=red_s, RED_D=red_d,
            num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"],
        )
        return
    pdl = bool(KNOBS["PDL"]) and gpu
    LAUNCHED["partial"] = _mla_decode_split[(row_blocks * sdv, splits)](
        q, cache, po, plse, M, S, split_len, D, cache.stride(0), SCALE * LOG2E,
        DL=DL, DR=DR, SPLIT_DV=sdv, BLOCK_H=bh, BLOCK_N=bn, EVEN=even, PDL=pdl, PREFETCH=prefetch,
        num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"],
    )
    block_s = triton.next_power_of_2(splits)
    block_d = min(DL, max(16, KNOBS["COMBINE_TILE"] // block_s))
    combine = _mla_decode_combine[(M, DL // block_d)]
    if pdl:  # launch_pdl is a compiled launch's option: the interpreter takes no such keyword
        LAUNCHED["combine"] = combine(po, plse, o, M, splits, DL, DL=DL, BLOCK_S=block_s, BLOCK_D=block_d,
                                      PDL=pdl, num_warps=4, launch_pdl=True)
    else:
        LAUNCHED["combine"] = combine(po, plse, o, M, splits, DL, DL=DL, BLOCK_S=block_s, BLOCK_D=block_d,
                                      PDL=pdl, num_warps=4)
