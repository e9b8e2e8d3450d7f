"""Search space of the mla_prefill flash-style template.

BLOCK_M: queries of one head per program (the fp32 accumulator is BLOCK_M x 512/SPLIT_DV). BLOCK_N: cache
rows per tile (BLOCK_N x 576 bf16 per pipeline stage). SPLIT_DV: 1 = one program computes all 512 output
columns; 2 = two programs per (block, head) each own 256 columns and both recompute the scores.
"""

SPACE = {
    "BLOCK_M": [32, 64],
    "BLOCK_N": [16, 32, 64],
    "SPLIT_DV": [1, 2],
    "num_warps": [4, 8],
    "num_stages": [1, 2, 3],
}
