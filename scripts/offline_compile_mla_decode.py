"""Compile the mla_decode split kernel for sm_90 without a GPU: shared memory, registers, spills (ptxas -v)
and whether wgmma was emitted, per knob setting. One JSON line per setting.

    python scripts/offline_compile_mla_decode.py [--knobs JSON] ...

--knobs (repeatable): a dict of BLOCK_H, BLOCK_N, SPLIT_DV, num_warps, num_stages (the others do not change
the split kernel's code); default: a few settings around the template's defaults. The local Triton compiles
(its version is printed); the GPU's Triton can differ.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT = [
    {"BLOCK_H": 64, "BLOCK_N": 64, "SPLIT_DV": 1, "num_warps": 8, "num_stages": 2},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 1, "num_warps": 8, "num_stages": 3},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 1, "num_warps": 8, "num_stages": 4},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 3},
    {"BLOCK_H": 64, "BLOCK_N": 64, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 2},
    {"BLOCK_H": 128, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 8, "num_stages": 2},
]


def compile_one(fn, knobs: dict) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    sig = {n: t for n, t in (("q_ptr", "*bf16"), ("c_ptr", "*bf16"), ("po_ptr", "*bf16"), ("plse_ptr", "*fp32"),
                             ("M", "i32"), ("S", "i32"), ("split_len", "i32"), ("stride_qm", "i32"),
                             ("stride_cs", "i32"), ("qk_scale", "fp32"))}
    consts = {"DL": 512, "DR": 64, "SPLIT_DV": knobs["SPLIT_DV"], "BLOCK_H": knobs["BLOCK_H"],
              "BLOCK_N": knobs["BLOCK_N"], "EVEN": True, "PDL": True}
    sig.update({k: "constexpr" for k in consts})
    # divisibility by 16, as the launcher reports it at the primary shape (aligned pointers, S 8192, D 576)
    aligned = [fn.arg_names.index(n) for n in sig if n not in consts and n != "qk_scale"]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    try:
        k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": knobs["num_warps"], "num_stages": knobs["num_stages"]})
    except Exception as e:  # noqa: BLE001 - over the shared-memory limit and the like: a row of its own
        return {"knobs": knobs, "error": f"{type(e).__name__}: {e}"[:200]}
    ptx = k.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        src = Path(d, "k.ptx")
        src.write_text(ptx)
        out = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(src), "-o", str(src) + ".o"],
                             capture_output=True, text=True)
    text = out.stderr + out.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {"knobs": knobs, "smem": k.metadata.shared, "regs": int(regs.group(1)) if regs else None,
            "spill_st_ld": [int(spills.group(1)), int(spills.group(2))] if spills else None,
            "wgmma": "wgmma.mma_async" in ptx, "cp_async": "cp.async" in ptx}


def main() -> int:
    import triton

    from baselines.mla_decode import kernel

    ap = argparse.ArgumentParser()
    ap.add_argument("--knobs", action="append", default=[])
    a = ap.parse_args()
    print(f"# triton {triton.__version__}", flush=True)
    for knobs in [json.loads(k) for k in a.knobs] or DEFAULT:
        print(json.dumps(compile_one(kernel._mla_decode_split, knobs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
