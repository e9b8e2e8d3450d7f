"""Compile KDA's state launches for sm_90 without a GPU: the starting kernel's serial state pass beside the
segmented scan's compose, walk and re-walk launches (baselines/kda/scan_kernel.py), at K = V = 128 and
32-row chunks. Per launch and setting: registers, shared memory and spills (ptxas -v), and the programs an
SM can hold by each (65,536 registers allocated per warp in multiples of 8 per thread; 228 KB of shared
memory, 1 KB reserved per program). One JSON line per row.

    python scripts/offline_compile_kda_scan.py

The local Triton compiles (its version is printed first); the GPU's Triton can differ.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from offline_compile import compile_sm90  # noqa: E402

K = V = 128
C = 32
STATE_SIG = {"w_ptr": "*bf16", "u_ptr": "*bf16", "qg_ptr": "*bf16", "kg_ptr": "*bf16", "a_ptr": "*bf16",
             "gl_ptr": "*fp32", "o_ptr": "*bf16"}
# (launch, constexprs beyond K, V, C; num_warps, num_stages)
ROWS = [
    ("start_state", {"BV": 32}, 4, 3),
    ("scan_state", {"BV": 32}, 4, 3),
    ("scan_state", {"BV": 16}, 4, 3),
    ("scan_state", {"BV": 32}, 4, 1),
    ("compose", {"BW": 32}, 4, 3),
    ("compose", {"BW": 32}, 4, 1),
    ("compose", {"BW": 64}, 4, 3),
    ("compose", {"BW": 64}, 8, 3),
    ("compose", {"BW": 128}, 8, 3),
    ("walk", {"BV": 32, "SCAN_PREC": "tf32x3"}, 8, 2),
    ("walk", {"BV": 32, "SCAN_PREC": "tf32"}, 8, 2),
]


def per_sm(regs: int, warps: int, smem: int) -> int:
    by_regs = 65536 // (32 * warps * (-(-regs // 8) * 8))
    by_smem = (228 * 1024) // (smem + 1024)
    return min(by_regs, by_smem)


def compile_row(start, scan, launch: str, extra: dict, warps: int, stages: int) -> dict:
    consts = {"K": K, "V": V, **extra}
    ints = {"T": "i32", "H": "i32", "NT": "i32"}
    if launch == "start_state":
        sig = {**STATE_SIG, "h0_ptr": "*fp32", "ht_ptr": "*fp32", **ints}
        fn, consts = start._kda_state, {**consts, "C": C, "HAS_H0": False, "HAS_HT": False}
    elif launch == "scan_state":
        sig = {**STATE_SIG, "st_ptr": "*fp32", "ht_ptr": "*fp32", **ints, "L": "i32", "NSEG": "i32"}
        fn, consts = scan._kda_scan_state, {**consts, "C": C, "HAS_HT": False}
    elif launch == "compose":
        sig = {"w_ptr": "*bf16", "u_ptr": "*bf16", "kg_ptr": "*bf16", "gl_ptr": "*fp32", "mn_ptr": "*fp32",
               "T": "i32", "NT": "i32", "L": "i32", "NSEG": "i32"}
        fn, consts = scan._kda_compose, {**consts, "C": C, "SKIP_M0": True}
    else:
        sig = {"mn_ptr": "*fp32", "h0_ptr": "*fp32", "st_ptr": "*fp32", "NSEG": "i32"}
        fn, consts = scan._kda_walk, {**consts, "HAS_H0": True}
    r = compile_sm90(fn, sig, consts, {"num_warps": warps, "num_stages": stages})
    r = {"launch": launch, **extra, **r}
    if r.get("regs"):
        r["programs_per_sm"] = per_sm(r["regs"], warps, r["smem"])
    return r


def main() -> int:
    import triton

    from baselines.kda import kernel as start
    from baselines.kda import scan_kernel as scan

    print(f"# triton {triton.__version__}", flush=True)
    for launch, extra, warps, stages in ROWS:
        print(json.dumps(compile_row(start, scan, launch, extra, warps, stages)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
