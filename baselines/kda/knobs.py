"""Search space of the KDA template (baselines/kda/kernel.py). Every combination is valid:
CHUNK    chunk length C (the prep kernel splits it into 16-row blocks for the solve)
BK       K (and V) block of the prep kernel: A is summed over K blocks, w and u are written by blocks
BV       V-block of the sequential state kernel (clamped to V; grid = V/BV * B*H programs)
FAST     per-chunk fast path (one factored product anchored at row 0) when the chunk's decay span <= BOUND;
         chunks with a larger span take the always-safe binary-level path
BOUND    span limit in nats for FAST (e^BOUND must stay finite in fp32/bf16 with room for sum over K: <= 80)
SOLVE_PREC  tl.dot input precision of the block solve's products (tf32 alone costs accuracy)
num_warps_prep / num_warps_state / num_stages   launch settings (num_stages: the state kernel's pipelining)
"""

SPACE = {
    "CHUNK": [32, 64],
    "BK": [16, 32, 64, 128],
    "BV": [16, 32, 64, 128],
    "FAST": [True, False],
    "BOUND": [40.0, 60.0, 80.0],
    "SOLVE_PREC": ["tf32", "tf32x3", "ieee"],
    "num_warps_prep": [4, 8],
    "num_warps_state": [2, 4, 8],
    "num_stages": [1, 2, 3, 4],
}
