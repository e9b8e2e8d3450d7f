"""Search space of the mla_prefill flash-style template (432 settings; kernel.py's docstring has the
design and its resource arithmetic).

BLOCK_M: query positions per program. BLOCK_H: consecutive heads per program; the score tile has
R = BLOCK_M * BLOCK_H rows, all reading one cache tile (1, 2 and 4 divide H = 64). BLOCK_N: cache rows per
tile. SPLIT_DV: 1 = one program computes all 512 output columns; 2 = two programs per (query block, head
block) own 256 each and both compute the scores. TMA: cache tiles by tensor descriptors (built in the
kernel) or by pointers (cp.async). num_warps: 4 is one warp group (64 rows per wgmma), 8 two.

Which settings fit (offline sm_90 compiles by scripts/offline_compile_mla_prefill.py, Triton 3.9):
  * shared memory = 1152 * R B of q + num_stages * 1152 * BLOCK_N B of cache tiles (+1 KiB with TMA),
    against 232448 B: R >= 256 never fits (288 KiB of q); R = 128 fits BLOCK_N 32 at up to 2 stages and
    BLOCK_N 64 at 1; R = 64 fits all but BLOCK_N 64 at 3 stages; R = 32 likewise. The compile itself does
    not refuse a setting over the limit; the launch does (OutOfResources, a failed candidate).
  * registers: the fp32 accumulator takes R * 512 / SPLIT_DV / (32 * num_warps) per thread; where that is
    256 or more (R = 128 at SPLIT_DV 1 with 8 warps or SPLIT_DV 2 with 4; R = 64, SPLIT_DV 1, 4 warps) the
    kernel spills (4 warps at the defaults' R = 128: 3.8 KB). Other neighbours of the defaults: one head
    at SPLIT_DV 1, 8 warps, 255 registers (72 B of spills by pointers at BLOCK_N 64, 16 B by TMA at
    BLOCK_N 32 with 4 stages); one warp group at R = 64, SPLIT_DV 2, 1 stage: 222 registers by TMA (109
    KiB: two programs per SM), 36 B of spills by pointers.
"""

SPACE = {
    "BLOCK_H": [1, 2, 4],
    "BLOCK_M": [32, 64, 128],
    "BLOCK_N": [32, 64],
    "SPLIT_DV": [1, 2],
    "TMA": [False, True],
    "num_warps": [4, 8],
    "num_stages": [1, 2, 3],
}
