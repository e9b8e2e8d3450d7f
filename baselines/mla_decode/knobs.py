"""Search space of the mla_decode split-KV template.

BLOCK_H: rows (query token x head) per program; tl.dot needs >= 16 rows on the GPU; 64 holds a 64x512 fp32
accumulator (needs 8 warps). BLOCK_N: cache rows per tile (a tile is BLOCK_N x 576 bf16 = 18/37/74 KB of
shared memory per pipeline stage). NUM_SPLITS: cache ranges streamed in parallel; programs =
cdiv(Q*H, BLOCK_H) * NUM_SPLITS should cover the 132 SMs. Every value here compiles alone; the GPU script
(scripts/gpu_mla.py) compiles the largest shared-memory corner (BLOCK_H 64, BLOCK_N 64, 2 stages).
"""

SPACE = {
    "BLOCK_H": [16, 32, 64],
    "BLOCK_N": [16, 32, 64],
    "NUM_SPLITS": [8, 16, 32, 64, 128, 256],
    "PARTIAL_BF16": [False, True],
    "SPLIT_DV": [1, 2],
    "num_warps": [4, 8],
    "num_stages": [1, 2, 3],
}
