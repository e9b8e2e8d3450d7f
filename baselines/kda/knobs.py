"""Search space of the KDA template (baselines/kda/kernel.py). Every combination is valid, except that BD may
not exceed CHUNK (BD 16 with CHUNK 16 is fine); forward() raises ValueError for an invalid one.
CHUNK    chunk length C: fewer, larger sequential steps in the state kernel against a larger prep (A, solve)
BK       K (and V) block of the prep kernel: A is summed over K blocks, w and u are written by blocks
BV       V-block of the sequential state kernel (clamped to V; grid = V/BV * B*H programs); each program
         re-reads the chunk's K-wide operands (w, qg, kg), so a small BV buys programs with L2 traffic
BD       rows of the diagonal blocks of A computed with the clamped, midpoint-anchored factorisation when a
         chunk is not FAST: 8 (clamp 24 nats, exact to ~1e-11) or 16 (one binary level fewer, clamp 11 nats:
         ~1e-5 change in A, invisible at bf16 precision)
FAST     per-chunk fast path (one product for the whole chunk, anchored at the midpoint of its G range) when
         the chunk's decay span <= BOUND; other chunks take the always-safe split (levels + diagonal blocks)
PREP     "chunk": launch 1 as kernel.py describes it; "halves" (at CHUNK 32; other chunk sizes take "chunk"): the chunk as two
         16-row halves, A's three nonzero 16 x 16 blocks one product each (diagonal blocks clamped and
         midpoint-anchored, the cross block anchored at the lower half's last row), block forward
         substitution for w and u; one path for every gate, so BK, BD, FAST and BOUND do not apply
BOUND    span limit in nats for FAST; each factor is <= e^{BOUND/2}, so <= 170 keeps it finite in fp32/bf16
PREP_DOT operands of the prep's products: "input" (the input dtype: bf16 on the GPU), "wu_tf32" (A in the input
         dtype, w and u in fp32/tf32), "tf32" (all fp32/tf32: ~15% less error at bf16 inputs, ~20% slower prep)
SOLVE_PREC  operands of the block-doubling solve: "input" (the input dtype) or fp32 at that tl.dot
         input_precision ("tf32", "tf32x3", "ieee"); w is rounded to the input dtype afterwards either way
num_warps_prep / num_warps_state / num_stages   launch settings (num_stages: the state kernel's pipelining;
         at CHUNK 64, num_stages 4 exceeds shared memory and the launch raises OutOfResources, and num_stages 1
         has died with an illegal memory access on an H200 while exact under the interpreter)
"""

SPACE = {
    "CHUNK": [16, 32, 64],
    "BK": [32, 64, 128],
    "BV": [16, 32, 64, 128],
    "BD": [8, 16],
    "FAST": [True, False],
    "PREP": ["chunk", "halves"],
    "BOUND": [40.0, 80.0, 160.0],
    "PREP_DOT": ["input", "wu_tf32", "tf32"],
    "SOLVE_PREC": ["input", "tf32", "tf32x3", "ieee"],
    "num_warps_prep": [4, 8],
    "num_warps_state": [2, 4, 8],
    "num_stages": [1, 2, 3, 4],
}
