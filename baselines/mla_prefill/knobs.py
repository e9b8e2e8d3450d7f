"""Search space of the mla_prefill flash-style template (432 settings; kernel.py's docstring has the
resource arithmetic).

BLOCK_M: query positions per program. BLOCK_H: consecutive heads per program; the score tile has
R = BLOCK_M * BLOCK_H rows, all reading one cache tile. BLOCK_N: cache rows per tile. SPLIT_DV: 1 = one
program computes all 512 output columns; 2 = two programs per (query block, head block) own 256 each and
both compute the scores. TMA: cache tiles by tensor descriptors (no address registers) or by pointers
(cp.async). num_warps / num_stages: 4 warps is one warp group (64 rows), 8 two.

Which settings fit (offline sm_90 compiles, scripts/offline_compile_mla_prefill.py):
  * shared memory is 1152 * R B of q plus num_stages * 1152 * BLOCK_N B of cache tiles (+1 KiB with TMA),
    against 232448 B: R = 256 with any tile and R = 128 with BLOCK_N 64 at >= 2 stages do not fit, nor
    R = 512 (BLOCK_H 4, BLOCK_M 128) at all;
  * registers: the fp32 accumulator is 16 * R / SPLIT_DV / num_warps per thread, so only settings with
    R / (SPLIT_DV * num_warps) <= 8 can hold it (128 registers) beside the scores; the rest spill.
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
