"""mla_prefill with the scores split across the two warp groups and the output accumulated transposed (Triton).

Why: the starting kernel (kernel.py) computes every score twice. Triton lays out a dot whose result feeds
another dot (the chain scores -> P -> P @ V) with all warps along M (AccelerateMatmul's warpsPerTileV3:
"chained dot" -> [num_warps, 1]); with 8 warps that is [8, 1] over 64 query rows, and wgmma's 64-row
minimum per warp group makes both warp groups compute the same 64 x BLOCK_N score tile. Its sm_90 code
(Triton 3.6 and 3.9) has the scores at warpsPerCTA [8, 1] and 72 m64n32k16 score wgmmas per tile and
warp group (36 k-steps x both 32-column halves); this design's has [4, 2] and 36. Per 64 x 64 tile the tensor cores run 2 x 4.7 (scores, K = 576)
+ 4.2 (P @ V) = 13.6 MFLOP for 8.9 useful: at most 65% of their rate; the starting kernel measures 54%
SM throughput.

The design, one program per (head, 64 queries) as in the starting kernel, 8 warps:
* Scores: S = q_lat @ tile_lat^T, then += q_rope @ tile_rope^T, each dot inside a branch on a runtime
  condition that always holds (qk_scale > 0, N > 0). A dot's result then reaches the P @ V dot only
  through its branch's result, which the chain test does not follow, so the scores get the unchained
  layout, warps [4, 2]: each warp group computes its own 64 x BLOCK_N/2 half, no tensor-core work twice.
  The row max and sum cross the two warp groups through shared memory (Triton's reduction). The two
  branches test different conditions so the compiler does not merge them (merged, the first dot feeds
  the second and is chained again).
* The rope tile (BLOCK_N x 64) is loaded into registers inside the first branch, before the latent dot,
  so its load is in flight while that dot runs. Loaded at the loop's top level the pipeliner gives it
  num_stages buffers of its own (the latent tile gets num_stages - 1), and at num_stages 3 the program
  needs 232 KB of shared memory, over the H200's 227 KB; in the branch it needs none.
* P @ V transposed: acc^T [512, 64] += tile_lat^T [512, BLOCK_N] @ P^T [BLOCK_N, 64]. The latent tile is
  the A operand straight from shared memory (a transposed view), P^T the B operand, stored to shared
  memory as bf16 from the scores' own layout. Written the usual way (P as the A operand, in registers)
  the compiler moves P's conversion to the dot-operand layout up to the fp32 scores and runs the
  softmax in both layouts, at 16-32 KB more shared memory (over the limit). The accumulator is
  512 x 64 fp32 over warps [8, 1]: 128 registers per thread, as before; the softmax's per-query factors
  are applied along its columns.
* LAZY (log2 units): the accumulator is rescaled only in tiles where some row's running max grew by more
  than LAZY (one block-wide test); otherwise P keeps the stale max as its reference (entries up to
  2^LAZY, well inside bf16 and fp32), and acc and l share that reference, so the result is exact. Once
  the maxima settle this skips the 512 x 64 multiply (128 FMULs per thread) of most tiles. LAZY -1
  rescales every tile, as the starting kernel does.
* QR_REGS: q_rope is masked once after its load, so the dot may take it from registers rather than
  from a load's shared-memory copy (Triton 3.6 stages it in shared memory all the same).
* As in the starting kernel: exp2 with the scale folded into the fp32 scores (log2 domain); query blocks
  issued last-first (the causal work grows with the block index, so the long ones start first); heads
  fastest in the grid (programs running together read the same cache rows from L2); tiles wholly below
  the diagonal run unmasked, only the BLOCK_M / BLOCK_N diagonal tiles apply the causal mask.

Shared memory at BLOCK_N 64, num_stages 3: q 72 KB + 2 x 64 KB latent tiles + 8 KB P^T = 208 KB. With
num_stages 2 the latent tile has one buffer, loaded after the P @ V dot that frees it: no prefetch.
SPLIT_QK False keeps the transposed P @ V but leaves the scores chained (the [8, 1] duplicated layout)
and loads the rope tile at the top level: the control for what the split gives (num_stages 2 to fit).
Offline sm_90 figures (registers, spills, shared memory) per setting, local Triton:
`python scripts/offline_compile_mla_prefill.py --template baselines/mla_prefill/split_scores_kernel.py
--knobs-file baselines/mla_prefill/split_scores_settings.jsonl`.
"""

import math

import triton
import triton.language as tl

KNOBS = {"BLOCK_N": 64, "LAZY": 8.0, "QR_REGS": True, "SPLIT_QK": True, "num_stages": 3, "num_warps": 8}
KNOB_SPACE = {
    "BLOCK_N": [32, 64],
    "LAZY": [-1.0, 0.0, 8.0],
    "QR_REGS": [True, False],
    "SPLIT_QK": [True, False],
    "num_stages": [2, 3, 4],
    "num_warps": [8],
}

BLOCK_M = 64  # queries per program: the 512-column fp32 accumulator fills 128 registers at 8 warps
SCALE = 1.0 / math.sqrt(192.0)  # fixed by the problem (see baselines/mla_decode/spec.py)
LOG2E = 1.4426950408889634


@triton.jit
def _tile(acc, m_i, l_i, q_l, q_r, c_ptr, n0, N, qpos, qk_scale,
          DL: tl.constexpr, DR: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
          SPLIT_QK: tl.constexpr, LAZY: tl.constexpr):
    n = n0 + tl.arange(0, BLOCK_N)
    dl = tl.arange(0, DL)
    dr = tl.arange(0, DR)
    kr_ptrs = c_ptr + n[:, None] * (DL + DR) + DL + dr[None, :]
    if CAUSAL:  # the diagonal tile may run past the cache
        kv = tl.load(c_ptr + n[:, None] * (DL + DR) + dl[None, :], mask=(n < N)[:, None], other=0.0)
    else:
        kv = tl.load(c_ptr + n[:, None] * (DL + DR) + dl[None, :])
    if SPLIT_QK:
        # always taken: the branches only hide the score dots from the chained-dot layout rule. The rope
        # tile is loaded into registers inside the first branch, in flight while the latent dot runs: the
        # pipeliner leaves a load in a branch alone (no buffers of its own in shared memory)
        s = tl.zeros([q_l.shape[0], BLOCK_N], tl.float32)
        kr = tl.zeros([BLOCK_N, DR], kv.dtype)
        if qk_scale > 0:
            kr = tl.load(kr_ptrs, mask=(n < N)[:, None], other=0.0)
            s = tl.dot(q_l, tl.trans(kv), s)
        if N > 0:
            s = tl.dot(q_r, tl.trans(kr), s)
        s = s * qk_scale
    else:
        if CAUSAL:
            kr = tl.load(kr_ptrs, mask=(n < N)[:, None], other=0.0)
        else:
            kr = tl.load(kr_ptrs)
        s = tl.dot(q_r, tl.trans(kr))
        s = tl.dot(q_l, tl.trans(kv), s) * qk_scale
    if CAUSAL:
        s = tl.where(n[None, :] <= qpos[:, None], s, float("-inf"))  # row i sees cache rows <= i
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if LAZY >= 0:
        # rescale only when some row's max grew by more than LAZY (log2 units): the stale max stays the
        # reference of P, acc and l alike, so the result is exact; P's entries stay below 2^LAZY
        if tl.max(m_new - m_i, 0) > LAZY:
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha
            acc = acc * alpha[None, :]  # acc is transposed: one column per query
            m_i = m_new
        p = tl.exp2(s - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
        m_new = m_i
    else:
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[None, :]  # acc is transposed: one column per query
    acc = tl.dot(tl.trans(kv), tl.trans(p.to(kv.dtype)), acc)
    return acc, m_new, l_i


@triton.jit
def _mla_prefill_split(
    q_ptr, c_ptr, o_ptr, N, qk_scale,
    H: tl.constexpr, DL: tl.constexpr, DR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_QK: tl.constexpr, QR_REGS: tl.constexpr, LAZY: tl.constexpr,
):
    D: tl.constexpr = DL + DR  # contiguous q [N, H, D], cache [N, D], o [N, H, DL] (run asserts it)
    h = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    qpos = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = qpos < N
    dl = tl.arange(0, DL)
    dr = tl.arange(0, DR)
    q_base = q_ptr + qpos[:, None] * (H * D) + h * D
    q_l = tl.load(q_base + dl[None, :], mask=rmask[:, None], other=0.0)
    q_r = tl.load(q_base + DL + dr[None, :], mask=rmask[:, None], other=0.0)
    if QR_REGS:  # not straight from a load: the dot takes it from registers, not shared memory
        q_r = tl.where(rmask[:, None], q_r, 0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([DL, BLOCK_M], tl.float32)
    lo = (pid_m * BLOCK_M) // BLOCK_N * BLOCK_N  # tiles below the block's first query: no mask
    for n0 in range(0, lo, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, q_l, q_r, c_ptr, n0, N, qpos, qk_scale,
                              DL, DR, BLOCK_N, False, SPLIT_QK, LAZY)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, N)
    for n0 in range(lo, hi, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, q_l, q_r, c_ptr, n0, N, qpos, qk_scale,
                              DL, DR, BLOCK_N, True, SPLIT_QK, LAZY)

    acc = acc / l_i[None, :]
    o_base = o_ptr + qpos[None, :] * (H * DL) + h * DL
    tl.store(o_base + dl[:, None], acc.to(o_ptr.dtype.element_ty), mask=rmask[None, :])


LAUNCHED: dict = {}  # the last compiled kernel (register / spill / shared-memory reports)


def run(inputs, out):
    q, cache, o = inputs["q"], inputs["kv_cache"], out["o"]
    N, H, D = q.shape
    DL = o.shape[-1]
    DR = D - DL
    assert cache.shape[0] == N and cache.shape[1] == D and o.shape[:2] == (N, H)
    # the kernel's strides are compile-time constants: fewer address registers than runtime strides
    assert q.stride() == (H * D, D, 1) and cache.stride() == (D, 1) and o.stride() == (H * DL, DL, 1)
    assert DL & (DL - 1) == 0 and DR & (DR - 1) == 0, "latent and rope widths must be powers of two"
    grid = (H, triton.cdiv(N, BLOCK_M))
    LAUNCHED["fwd"] = _mla_prefill_split[grid](
        q, cache, o, N, SCALE * LOG2E, H=H, DL=DL, DR=DR, BLOCK_M=BLOCK_M, BLOCK_N=KNOBS["BLOCK_N"], SPLIT_QK=KNOBS["SPLIT_QK"],
        QR_REGS=KNOBS["QR_REGS"], LAZY=KNOBS["LAZY"], num_warps=KNOBS["num_warps"], num_stages=KNOBS["num_stages"],
    )
