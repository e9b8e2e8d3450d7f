"""Search space of the mla_decode split-KV template (kernel.py: split kernel + combine kernel, or one fused
launch with FUSED).

SPLIT_DV (1 or 2): programs per (row block, split), each owning DL / SPLIT_DV of the 512 output columns;
with 2 both compute the split's scores (1.53x FLOPs) and each reads the whole tile (its own latent half for
the scores and P @ V, the other half for the scores only: the same shared memory per tile as SPLIT_DV 1).
The default 2 with num_warps 4 and BLOCK_H 64 is one warp group per program with a 64 x 256 fp32
accumulator; SPLIT_DV 1 with BLOCK_H 64 needs num_warps 8 (at 4 warps it spills kilobytes per thread).
BLOCK_H: rows (query token x head) per program. 16 and 32 compile to mma.sync; 64 and 128 to Hopper wgmma.
128 is for SPLIT_DV 2 at 8 warps: each warp group owns 64 rows (scores computed once, no exchange between
the warp groups), a 128 x 256 fp32 accumulator, q 144 KB of shared memory, so BLOCK_N 32 at 2 stages or
BLOCK_N 16 at 3; Q1 (64 rows) runs 64-row blocks with it. The cache is read from L2 once per row block and
dv part: cdiv(Q*H, BLOCK_H) * SPLIT_DV times.
MIN_ROW_BLOCKS: when > 1, the row block shrinks (powers of two, >= 16) until there are at least this many
(or it reaches 16): with BLOCK_H 32 and 4, Q1 (64 rows) runs 16-row blocks and Q4 (256 rows) 32-row ones.
1 = BLOCK_H as given (never wider than the next power of two of Q*H).
BLOCK_N: cache rows per tile (BLOCK_N x 576 bf16 = 18/37/74/147 KB of shared memory per pipeline stage, plus
the BLOCK_H x 576 q tile). It is also the width of the score instructions (q is re-read from shared
memory by each): 64 is the widest that leaves room for two stages; 128 fits one stage (no tile in flight
while one is computed: with PREFETCH it comes from L2), and needs 8 warps (at 4 warps it spills 1 KB).
num_stages: shared-memory buffers per tile stream, num_stages - 1 tiles in flight while one is computed.
GRID: target number of split-kernel programs (FUSED: at most the SM count); splits = GRID / (row blocks *
SPLIT_DV), at most S / (MIN_TILES * BLOCK_N), rounded so every split is whole BLOCK_N tiles (so one
setting gives Q1 four times the splits of Q4 at the same BLOCK_H, unless MIN_TILES caps Q1's).
MIN_TILES: tiles per split at least (1: as many splits as GRID allows; 4: e.g. SPLIT_DV 1 with BLOCK_N 32
gives Q1 64 splits of 4 tiles instead of 128 of 2). Fewer splits: longer pipelines, smaller partials, fewer
programs.
The partials are Q*H*splits*512 elements (bf16: 4.2 MB at Q1 with 64 splits), written by the split kernel
and read back by the combine.
COMBINE_TILE: partial elements one combine program reduces (splits x columns); fewer means more programs.
With FUSED: the reduction tile, RED_S = COMBINE_TILE / REDUCE_D splits x REDUCE_D columns per step, and
when every split fits one step, as many rows per item as the tile holds while there are at least as many
items as programs (16384 with REDUCE_D 256: one step per item at Q1 and Q4, one item per program).
PARTIAL_BF16: bf16 partials (half the traffic; +0.2-0.4e-3 rel-RMS error measured on the H200, against a
3.8-4.5e-3 tolerance); the CPU interpreter path always keeps fp32.
PDL: launch the combine as a programmatic dependent launch (griddepcontrol) of the split kernel, which
signals after its stores: the combine's launch overlaps the split kernel's tail (on the H200, Triton 3.6,
CUDA graphs: -0.6 us at Q1 and -1.6 us at Q4 on the earlier BLOCK_H 32 defaults). Signalling at the split
kernel's start measured slower (+1.6 us at Q1, +10 us at Q4). GPU only.
PREFETCH: each split program first asks L2 for its share of its split's rows (one bulk prefetch per thread,
`cp.async.bulk.prefetch.L2`), so the cache streams from HBM while q loads and the tile pipeline reads L2;
it also lets num_stages 1-2 settings (BLOCK_N 64 at 2 stages; two 110 KB programs per SM at num_stages 1
with GRID 256) find their next tile in L2. GPU only (inline PTX; the interpreter skips it).
FUSED: True runs the split-KV work and the combine in one launch (`_mla_decode_fused`): partials, an
arrival counter, a grid-wide spin barrier, then every program reduces a share of the output. Its grid is
capped at the SM count (the barrier needs every program resident); PDL does not apply. With the earlier
SPLIT_DV 1 / 8-warp programs, and with the SPLIT_DV 2 programs with a reduction of one round trip per
RED_S splits plus one for the max (Q4: 4 items of 2 round trips per program), no setting beat the
two-kernel design on the H200 (docs/results.md).
REDUCE_D (FUSED only): output columns per reduction item (a row's REDUCE_D columns); with the earlier
programs 512 measured best at Q4, 256 at Q1; 64 and 128 slower at both (so left out: every value multiplies
the knob product the rules test renders).

Invalid or useless corners (the harness scores compile failures as failed candidates): over the H200's
227 KB of shared memory (offline sm_90 compile, Triton 3.9, scripts/offline_compile_mla_decode.py):
BLOCK_N 64 with num_stages >= 3 at BLOCK_H 64, and with num_stages 4 at any BLOCK_H; BLOCK_N 128 with
num_stages >= 2, and with BLOCK_H 128; BLOCK_H 128 with BLOCK_N 64 at num_stages >= 2 and with BLOCK_N 32
at num_stages >= 3. BLOCK_H 64 with SPLIT_DV 1 and
num_warps 4, and BLOCK_H 128 with SPLIT_DV 1 or num_warps 4, compile but spill heavily (valid, slow).
"""

SPACE = {
    "BLOCK_H": [16, 32, 64, 128],
    "BLOCK_N": [16, 32, 64, 128],
    "COMBINE_TILE": [2048, 4096, 8192, 16384],
    "FUSED": [False, True],
    "GRID": [64, 128, 256, 512],
    "MIN_ROW_BLOCKS": [1, 2, 4, 8],
    "MIN_TILES": [1, 4],
    "PARTIAL_BF16": [False, True],
    "PDL": [False, True],
    "PREFETCH": [False, True],
    "REDUCE_D": [256, 512],
    "SPLIT_DV": [1, 2],
    "num_warps": [4, 8],
    "num_stages": [1, 2, 3, 4],
}
