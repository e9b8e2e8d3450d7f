"""Compile the mla_decode kernels for sm_90 without a GPU: shared memory, registers, spills (ptxas -v) and
whether wgmma was emitted, per knob setting. One JSON line per setting.

    python scripts/offline_compile_mla_decode.py [--knobs JSON] ...

--knobs (repeatable): a dict of BLOCK_H, BLOCK_N, SPLIT_DV, num_warps, num_stages, and optionally PREFETCH
(default True) and FUSED (default False: the split kernel; True: the one-launch kernel, whose reduction
tile is RED_R x RED_S x RED_D, default 1 x 64 x 256: Q1's with REDUCE_D 256 and COMBINE_TILE 16384); the
other knobs do not change the code. Default: the template's defaults, the earlier ones (no PREFETCH) and
the settings bench_mla_decode.py compares. The local Triton compiles (its version is printed); the GPU's
Triton can differ.

    python scripts/offline_compile_mla_decode.py --template baselines/mla_decode/arrival_kernel.py [--knobs JSON]

--template: the arrival-combine design (its one kernel `_mla_decode_arrival`); --knobs then also take
COMBINERS and RED_S (the combine's splits per step, default 64: Q1's with COMBINE_TILE 16384). Default:
each line of the template's settings file (X_settings.jsonl beside X_kernel.py) over its defaults.
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
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 4, "PREFETCH": False},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 4},
    {"BLOCK_H": 64, "BLOCK_N": 64, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 2},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 1},  # 2 programs per SM
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 8, "num_stages": 4},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 8, "num_stages": 2},
    {"BLOCK_H": 128, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 8, "num_stages": 2},
    {"BLOCK_H": 64, "BLOCK_N": 128, "SPLIT_DV": 2, "num_warps": 8, "num_stages": 1},
    {"BLOCK_H": 64, "BLOCK_N": 128, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 1},
    {"BLOCK_H": 64, "BLOCK_N": 64, "SPLIT_DV": 1, "num_warps": 8, "num_stages": 2},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 4, "FUSED": True},
    {"BLOCK_H": 64, "BLOCK_N": 64, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 2, "FUSED": True},
    {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 4, "FUSED": True,
     "RED_R": 4, "RED_S": 16, "RED_D": 256},  # Q4's reduction tile with REDUCE_D 256, COMBINE_TILE 16384
]
COMMON = (("q_ptr", "*bf16"), ("c_ptr", "*bf16"))
ARRIVAL_BASE = {"BLOCK_H": 64, "BLOCK_N": 32, "SPLIT_DV": 2, "num_warps": 4, "num_stages": 4, "PREFETCH": False,
                "COMBINERS": 32}


def compile_one(kernel, knobs: dict) -> dict:
    consts = {"DL": 512, "DR": 64, "SPLIT_DV": knobs["SPLIT_DV"], "BLOCK_H": knobs["BLOCK_H"],
              "BLOCK_N": knobs["BLOCK_N"], "EVEN": True, "PREFETCH": knobs.get("PREFETCH", True)}
    if knobs.get("FUSED"):
        sig = dict(COMMON + (("o_ptr", "*bf16"), ("po_ptr", "*bf16"), ("plse_ptr", "*fp32"), ("cnt_ptr", "*i64"),
                             ("M", "i32"), ("S", "i32"), ("split_len", "i32"), ("num_splits", "i32"),
                             ("stride_qm", "i32"), ("stride_cs", "i32"), ("stride_om", "i32"), ("qk_scale", "fp32")))
        consts.update(BARRIER=True, RED_R=knobs.get("RED_R", 1), RED_S=knobs.get("RED_S", 64),
                      RED_D=knobs.get("RED_D", 256))
        return compile_sm90(kernel._mla_decode_fused, sig, consts, knobs)
    sig = dict(COMMON + (("po_ptr", "*bf16"), ("plse_ptr", "*fp32"), ("M", "i32"), ("S", "i32"),
                         ("split_len", "i32"), ("stride_qm", "i32"), ("stride_cs", "i32"), ("qk_scale", "fp32")))
    consts["PDL"] = True
    return compile_sm90(kernel._mla_decode_split, sig, consts, knobs)


def compile_arrival(kernel, knobs: dict) -> dict:
    """The arrival-combine design's one kernel (split loop, arrival counter, the last arrivals' combine)."""
    consts = {"DL": 512, "DR": 64, "SPLIT_DV": knobs["SPLIT_DV"], "BLOCK_H": knobs["BLOCK_H"],
              "BLOCK_N": knobs["BLOCK_N"], "EVEN": True, "PREFETCH": knobs.get("PREFETCH", False),
              "COMBINERS": knobs.get("COMBINERS", 32), "RED_S": knobs.get("RED_S", 64)}
    sig = dict(COMMON + (("o_ptr", "*bf16"), ("po_ptr", "*bf16"), ("plse_ptr", "*fp32"), ("cnt_ptr", "*i64"),
                         ("M", "i32"), ("S", "i32"), ("split_len", "i32"), ("num_splits", "i32"),
                         ("stride_qm", "i32"), ("stride_cs", "i32"), ("stride_om", "i32"), ("qk_scale", "fp32")))
    return compile_sm90(kernel._mla_decode_arrival, sig, consts, knobs)


def _arrival_settings(template: Path) -> list[dict]:
    """Each line of the template's settings file over its defaults (code-shaping knobs only); no file: the
    defaults alone."""
    shaping = set(ARRIVAL_BASE)
    lines = template.with_name(template.name.replace("_kernel.py", "_settings.jsonl"))
    overs = [json.loads(ln) for ln in lines.read_text().splitlines() if ln.strip()] if lines.exists() else [{}]
    return [{**ARRIVAL_BASE, **{k: v for k, v in o.items() if k in shaping}} for o in overs]


def main() -> int:
    import importlib.util

    import triton

    ap = argparse.ArgumentParser()
    ap.add_argument("--knobs", action="append", default=[])
    ap.add_argument("--template", type=Path, help="the arrival-combine design's template instead of kernel.py")
    a = ap.parse_args()
    print(f"# triton {triton.__version__}", flush=True)
    given = [json.loads(k) for k in a.knobs]
    if a.template:
        if not a.template.is_file():
            ap.error(f"no template file {a.template}")
        spec = importlib.util.spec_from_file_location(a.template.stem, a.template)
        kernel = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernel)
        for knobs in [{**ARRIVAL_BASE, **k} for k in given] or _arrival_settings(a.template):
            print(json.dumps(compile_arrival(kernel, knobs)), flush=True)
        return 0
    from baselines.mla_decode import kernel

    for knobs in given or DEFAULT:
        print(json.dumps(compile_one(kernel, knobs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
