"""Compile the mla_prefill kernel for sm_90 without a GPU: shared memory, registers, spills (ptxas -v)
and whether wgmma, cp.async and TMA were emitted. One JSON line per knob setting.

    python scripts/offline_compile_mla_prefill.py [--knobs JSON] ... [--space] [--out FILE]

--knobs (repeatable): overrides of the template's defaults (`{}`: the defaults); default: the defaults
and the neighbours that scripts/bench_mla_prefill.py times. --space: every setting of the knob space
instead. The local Triton compiles (its version is printed); the GPU's Triton can differ. The figures in
baselines/mla_prefill/kernel.py and knobs.py come from this script.
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

NEIGHBOURS = [  # the settings scripts/bench_mla_prefill.py times, less the defaults
    {"BLOCK_H": 1, "BLOCK_N": 64, "SPLIT_DV": 1},  # the previous defaults
    {"TMA": True},
    {"BLOCK_N": 64, "num_stages": 1},
    {"BLOCK_H": 4, "BLOCK_M": 32},
    {"BLOCK_H": 1, "num_warps": 4, "num_stages": 1, "TMA": True},
    {"BLOCK_H": 1, "SPLIT_DV": 1, "num_stages": 4, "TMA": True},
]


def compile_one(fn, knobs: dict) -> dict:
    sig = {n: t for n, t in (("q_ptr", "*bf16"), ("c_ptr", "*bf16"), ("o_ptr", "*bf16"), ("N", "i32"), ("H", "i32"),
                             ("stride_qn", "i32"), ("stride_qh", "i32"), ("stride_cs", "i32"), ("stride_on", "i32"),
                             ("stride_oh", "i32"), ("qk_scale", "fp32"))}
    consts = {"DL": 512, "DR": 64, "SPLIT_DV": knobs["SPLIT_DV"], "BLOCK_M": knobs["BLOCK_M"],
              "BLOCK_N": knobs["BLOCK_N"], "BLOCK_H": knobs["BLOCK_H"], "EVEN_H": True, "TMA": knobs["TMA"]}
    return compile_sm90(fn, sig, consts, knobs)


def main() -> int:
    import triton

    from baselines.mla_prefill import kernel
    from baselines.registry import get_problem

    ap = argparse.ArgumentParser()
    ap.add_argument("--knobs", action="append", default=[])
    ap.add_argument("--space", action="store_true")
    ap.add_argument("--out", help="also write the rows here as one JSON list")
    a = ap.parse_args()
    print(f"# triton {triton.__version__}", flush=True)
    if a.space:
        space = get_problem("mla_prefill").knob_space()
        settings = [dict(zip(space, values)) for values in itertools.product(*space.values())]
    else:
        settings = [{**kernel.KNOBS, **n} for n in [json.loads(k) for k in a.knobs] or [{}, *NEIGHBOURS]]
    rows = []
    for knobs in settings:
        row = compile_one(kernel._mla_prefill_fwd, knobs)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
