"""Compile the mla_prefill kernel for sm_90 without a GPU: shared memory, registers, spills (ptxas -v)
and whether wgmma was emitted, per knob setting of its search space. One JSON line per setting.

    python scripts/offline_compile_mla_prefill.py [--out FILE]

The figures in baselines/mla_prefill/knobs.py about which settings exceed the H200's 227 KiB of shared
memory come from this (Triton 3.9.0, no GPU). Another Triton version can differ.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def compile_one(fn, knobs: dict) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    sig = {n: t for n, t in (("q_ptr", "*bf16"), ("c_ptr", "*bf16"), ("o_ptr", "*bf16"), ("N", "i32"), ("H", "i32"),
                             ("stride_qn", "i32"), ("stride_qh", "i32"), ("stride_cs", "i32"), ("stride_on", "i32"),
                             ("stride_oh", "i32"), ("qk_scale", "fp32"))}
    consts = {"DL": 512, "DR": 64, "SPLIT_DV": knobs["SPLIT_DV"], "BLOCK_M": knobs["BLOCK_M"],
              "BLOCK_N": knobs["BLOCK_N"], "BLOCK_H": knobs["BLOCK_H"], "EVEN_H": True}
    sig.update({k: "constexpr" for k in consts})
    # divisibility by 16, as the launcher reports it at the primary shape (N 8192, H 64, aligned pointers)
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
            "wgmma": "wgmma.mma_async" in ptx}


def main() -> int:
    from baselines.mla_prefill import kernel
    from baselines.registry import get_problem

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="also write the rows here as one JSON list")
    a = ap.parse_args()
    space = get_problem("mla_prefill").knob_space()
    rows = []
    for values in itertools.product(*space.values()):
        row = compile_one(kernel._mla_prefill_fwd, dict(zip(space, values)))
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
