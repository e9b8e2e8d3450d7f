"""Search space of the KDA template (baselines/kda/kernel.py). Every combination is valid except SUB 4 with
COUPLE state or ROWS split, for which forward() raises ValueError, and SUB 4 with num_stages 4 (over the
shared memory).
SUB      16-row sub-chunks per step of the sequential state pass: 1 (a step is one [32, K] x [K, BV] product
         and the update), 2 (half the steps; the sub-chunks of a step are coupled, see COUPLE) or 4 (a quarter;
         COUPLE prep and ROWS pad only, its prep spill-free at 8 warps); a step's state-pass product has
         32 SUB rows
COUPLE   where the in-step coupling of SUB 2 goes (SUB 4: "prep" only): "prep" (one program per step folds
         it into the second sub-chunk's operands: the state pass's chain is two products a step) or "state"
         (one program per sub-chunk stores [M; -N], which the state pass applies to v_new_a: a third product
         on its chain)
BV       V block of the state pass (clamped to V; grid = V/BV * B*H programs); each program re-reads the
         step's K-wide operands (wq, kg), so a small BV buys programs with L2 traffic
ROWS     how the state pass separates the rows of Y = uo - wq S (v_new and o of each sub-chunk): "pad" keeps
         Y whole and loads kg and [M; -N] zero-padded to Y's rows (wider products, no register shuffles);
         "split" splits Y into [16, BV] blocks (tl.split) and joins v_new again for the update
PREP_DOT operands of the prep's products: "input" (the input dtype: bf16 on the GPU), "mixed" (A products in
         the input dtype; solve, w, u, q', ou, M, N in fp32/tf32), "tf32" (all fp32/tf32)
maxnreg_prep registers per thread the prep may use (0: as ptxas chooses, 218 at COUPLE prep, 178 at COUPLE
         state, 128 at SUB 1, K = 128, 4 warps): 168 fits three 4-warp programs on an SM, 128 four; below the
         natural count ptxas spills
num_warps_prep / num_warps_state   warps per program of each launch
num_stages   software pipelining of the state pass's loads (shared memory per stage grows with SUB: at SUB 4,
         4 stages need 299 KB and the launch raises OutOfResources; 3 stages fit with 225 KB)
"""

SPACE = {
    "SUB": [1, 2, 4],
    "BV": [16, 32, 64, 128],
    "COUPLE": ["prep", "state"],
    "ROWS": ["pad", "split"],
    "PREP_DOT": ["input", "mixed", "tf32"],
    "maxnreg_prep": [0, 128, 168, 224],
    "num_warps_prep": [2, 4, 8],
    "num_warps_state": [2, 4, 8],
    "num_stages": [1, 2, 3, 4],
}
