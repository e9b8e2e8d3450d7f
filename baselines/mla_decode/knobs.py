"""Search space of the mla_decode split-KV template.

BLOCK_H: rows (query token x head) per program; 16 compiles to mma.sync, 64 to Hopper wgmma (a 64x512 fp32
accumulator: 255 registers at 8 warps). BLOCK_N: cache rows per tile (BLOCK_N x 576 bf16 = 18/37/74 KB
of shared memory per pipeline stage). NUM_SPLITS: cache ranges streamed in parallel; programs =
cdiv(Q*H, BLOCK_H) * SPLIT_DV * NUM_SPLITS; the fp32 partials are Q*H*NUM_SPLITS*512*4 bytes (8.4 MB at
Q1, 64 splits: as much as the cache). PARTIAL_BF16 halves that traffic (+0.5e-3 rel-RMS error).
SPLIT_DV = 2 halves the accumulator and recomputes the scores (measured slower everywhere on the H200).

Every value compiles on its own; a few corners exceed the H200's 227 KB of shared memory and raise
OutOfResources at compile time (measured: BLOCK_H 32/64 + BLOCK_N 64 + SPLIT_DV 2 at 2-3 stages) -- the
harness must score those as failed candidates.
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
