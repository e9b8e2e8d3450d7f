"""Search space of the mla_prefill flash-style template.

BLOCK_M: queries of one head per program (the fp32 accumulator is BLOCK_M x 512/SPLIT_DV). BLOCK_N: cache
rows per tile (BLOCK_N x 576 bf16 per pipeline stage, plus the 64 x 576 q tile). SPLIT_DV: 1 = one program
computes all 512 output columns; 2 = two programs per (block, head) each own 256 columns and both
recompute the scores (1.53x FLOPs; measured 2.4-2.8x slower on the H200).

Every value compiles on its own; some corners exceed the H200's 227 KB of shared memory (measured:
BLOCK_M 64 + BLOCK_N 64 + SPLIT_DV 2 + 2 stages; predicted: BLOCK_N 64 with 3 stages) and raise
OutOfResources at compile time -- the harness must score those as failed candidates. 4 warps with a
64 x 512 accumulator compiles but spills heavily (450 spilled registers, 2x slower). Numbers: docs/mla.md.
"""

SPACE = {
    "BLOCK_M": [32, 64],
    "BLOCK_N": [16, 32, 64],
    "SPLIT_DV": [1, 2],
    "num_warps": [4, 8],
    "num_stages": [1, 2, 3],
}
