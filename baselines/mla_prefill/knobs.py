"""Search space of the mla_prefill flash-style template (216 settings).

BLOCK_M: query positions per program. BLOCK_H: consecutive heads per program; the program's score tile has
R = BLOCK_M * BLOCK_H rows (every head reads the same cache rows under the same causal mask, so one cache
tile serves all BLOCK_H heads). BLOCK_H 1 is the one-head kernel, compiled to the same PTX as before the
knob existed; 1, 2 and 4 all divide H = 64. BLOCK_N: cache rows per tile. SPLIT_DV: 1 = one program
computes all 512 output columns; 2 = two programs per (block, head block) each own 256 columns and both
recompute the scores (1.53x FLOPs; measured 2.4-2.8x slower on the H200 at BLOCK_H 1).

Resources (bf16 = 2 B; the H200 allows 227 KiB = 232448 B of shared memory per program):
  q tile       R x 576 bf16 = 1152*R B, resident all loop long: 36 / 72 / 144 / 288 KiB for R = 32/64/128/256
  cache tile   BLOCK_N x 576 bf16 = 18 / 36 / 72 KiB per pipeline stage (+ BLOCK_N x 256 bf16 = 8/16/32 KiB
               more per stage with SPLIT_DV 2 and num_stages >= 2: the separate V slice)
  accumulator  R x 512/SPLIT_DV fp32 in registers = 16*R/SPLIT_DV/num_warps registers per thread
               (R 64, 8 warps: 128 of the 255 cap; R 128: 256 -> always spills with SPLIT_DV 1)
With R >= 64 (wgmma) the shared memory is exactly 1152*R + num_stages * per-stage bytes (1 stage: no V
slice); R = 32 lowers to mma.sync, whose q handling differs (smaller, irregular sizes).

Expected compile-time failures (OutOfResources; the harness must score them as failed candidates). Sizes
from offline `triton.compile` for sm_90 (scripts/offline_compile_mla_prefill.py, Triton 3.9, no GPU; the
one corner also measured on the H200, M64 N64 dv2 st2 = 286720 B, matches): 82 of the 216 settings
exceed 232448 B:
  * BLOCK_H 4 with BLOCK_M 64 (R = 256): all 36 -- the q tile alone is 288 KiB.
  * R = 128 (BLOCK_H 2 + BLOCK_M 64, BLOCK_H 4 + BLOCK_M 32): 144 KiB of q leaves 83 KiB: fails with
    BLOCK_N 64 at >= 2 stages, BLOCK_N 32 at 3 stages or with SPLIT_DV 2 at 2 stages (14 + 14).
  * R = 64 (BLOCK_H 1 + BLOCK_M 64, BLOCK_H 2 + BLOCK_M 32): BLOCK_N 64 at 3 stages, BLOCK_N 64 + SPLIT_DV 2
    at >= 2 stages, BLOCK_N 32 + SPLIT_DV 2 at 3 stages (228 KiB, just over) (8 + 8).
  * R = 32 (BLOCK_H 1 + BLOCK_M 32): BLOCK_N 64 + SPLIT_DV 2 at 3 stages (2).
Among those that fit, R = 128 with SPLIT_DV 1 spills (ptxas: 3.3-5.2 KB of spill stores per thread at 8
warps, 12-16.5 KB at 4 warps), as the accumulator arithmetic predicts, and R = 128 is spill-free only with
SPLIT_DV 2 at 8 warps; 4 warps with R = 64 and SPLIT_DV 1 spills too (measured at BLOCK_H 1: 450 spilled
registers, 2x slower).
"""

SPACE = {
    "BLOCK_H": [1, 2, 4],
    "BLOCK_M": [32, 64],
    "BLOCK_N": [16, 32, 64],
    "SPLIT_DV": [1, 2],
    "num_warps": [4, 8],
    "num_stages": [1, 2, 3],
}
