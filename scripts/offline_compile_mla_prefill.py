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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from offline_compile import compile_sm90  # noqa: E402


def compile_one(fn, knobs: dict) -> dict:
    sig = {n: t for n, t in (("q_ptr", "*bf16"), ("c_ptr", "*bf16"), ("o_ptr", "*bf16"), ("N", "i32"), ("H", "i32"),
                             ("stride_qn", "i32"), ("stride_qh", "i32"), ("stride_cs", "i32"), ("stride_on", "i32"),
                             ("stride_oh", "i32"), ("qk_scale", "fp32"))}
    consts = {"DL": 512, "DR": 64, "SPLIT_DV": knobs["SPLIT_DV"], "BLOCK_M": knobs["BLOCK_M"],
              "BLOCK_N": knobs["BLOCK_N"], "BLOCK_H": knobs["BLOCK_H"], "EVEN_H": True}
    return compile_sm90(fn, sig, consts, knobs)


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
