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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from offline_compile import compile_sm90  # noqa: E402

DEFAULT = [
    {"BLOCK_H": 64, "BLOCK_N": 64, "SPLIT_DV": 1, "num_warps": 8, "num_stages": 2},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 1, "num_warps": 8, "num_stages": 3},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 1, "num_warps": 8, "num_stages": 4},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 3},
    {"BLOCK_H": 64, "BLOCK_N": 64, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 2},
    {"BLOCK_H": 128, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 8, "num_stages": 2},
]


def compile_one(fn, knobs: dict) -> dict:
    sig = {n: t for n, t in (("q_ptr", "*bf16"), ("c_ptr", "*bf16"), ("po_ptr", "*bf16"), ("plse_ptr", "*fp32"),
                             ("M", "i32"), ("S", "i32"), ("split_len", "i32"), ("stride_qm", "i32"),
                             ("stride_cs", "i32"), ("qk_scale", "fp32"))}
    consts = {"DL": 512, "DR": 64, "SPLIT_DV": knobs["SPLIT_DV"], "BLOCK_H": knobs["BLOCK_H"],
              "BLOCK_N": knobs["BLOCK_N"], "EVEN": True, "PDL": True}
    return compile_sm90(fn, sig, consts, knobs)


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
