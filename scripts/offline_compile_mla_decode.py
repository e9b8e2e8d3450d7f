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

--template: the arrival-combine design (its one kernel `_mla_decode_arrival`) at Q1 and Q4, each --knobs
over the template's defaults (any of its knobs; the sizes that follow from them by the template's
launch_plan on 132 SMs). Default: each line of the template's settings file (X_settings.jsonl beside
X_kernel.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
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


def compile_arrival(template: Path, knobs: dict, Q: int, tmp: str) -> dict:
    """The arrival-combine design's one kernel at the primary shape with Q query tokens on an H200 (132 SMs):
    the template rendered with `knobs` (its defaults under them), its own launch_plan giving the block,
    combiner and reduction-tile sizes."""
    from baselines.problem import default_knobs, render

    source = template.read_text()
    path = Path(tmp) / f"arrival_{abs(hash(json.dumps(knobs, sort_keys=True)))}.py"
    path.write_text(render(source, knobs))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    kernel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel)
    full = {**default_knobs(source), **knobs}
    plan = kernel.launch_plan(Q * 64, 8192, 512, 132)
    consts = {"DL": 512, "DR": 64, "SPLIT_DV": full["SPLIT_DV"], "BLOCK_H": plan["BLOCK_H"],
              "BLOCK_N": full["BLOCK_N"], "EVEN": True, "PREFETCH": full["PREFETCH"],
              "COMBINERS": plan["COMBINERS"], "RED_S": plan["RED_S"]}
    sig = dict(COMMON + (("o_ptr", "*bf16"), ("po_ptr", "*bf16"), ("plse_ptr", "*fp32"), ("cnt_ptr", "*i64"),
                         ("M", "i32"), ("S", "i32"), ("split_len", "i32"), ("num_splits", "i32"),
                         ("stride_qm", "i32"), ("stride_cs", "i32"), ("stride_om", "i32"), ("qk_scale", "fp32")))
    row = compile_sm90(kernel._mla_decode_arrival, sig, consts, {**knobs, "num_warps": full["num_warps"],
                                                                  "num_stages": full["num_stages"]})
    return {"Q": Q, "plan": plan, **row}


def _arrival_settings(template: Path) -> list[dict]:
    """Each line of the template's settings file (X_settings.jsonl beside X_kernel.py); no file: {}."""
    lines = template.with_name(template.name.replace("_kernel.py", "_settings.jsonl"))
    return [json.loads(ln) for ln in lines.read_text().splitlines() if ln.strip()] if lines.exists() else [{}]


def main() -> int:
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
        with tempfile.TemporaryDirectory() as tmp:
            for knobs in given or _arrival_settings(a.template):
                for Q in (1, 4):
                    try:
                        row = compile_arrival(a.template, knobs, Q, tmp)
                    except ValueError as e:  # a knob the template has not
                        ap.error(str(e))
                    print(json.dumps(row), flush=True)
        return 0
    from baselines.mla_decode import kernel

    for knobs in given or DEFAULT:
        print(json.dumps(compile_one(kernel, knobs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
