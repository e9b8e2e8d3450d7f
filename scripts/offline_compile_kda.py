"""Compile the two kda kernels for sm_90 without a GPU: shared memory, registers, spills (ptxas -v) and whether
wgmma was emitted, per knob setting, at the primary shape's head size (K = V = 128, bf16 intermediates). One
JSON line per kernel and setting.

    python scripts/offline_compile_kda.py [--knobs JSON] ...

--knobs (repeatable): knob overrides of the template's defaults; default: the defaults and the settings
scripts/bench_kda.py times. The local Triton compiles
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
    {},
    {"num_warps_prep": 8, "maxnreg_prep": 168},
    {"maxnreg_prep": 168},
    {"COUPLE": "state", "maxnreg_prep": 168},
    {"COUPLE": "state"},
    {"SUB": 1, "maxnreg_prep": 128},
    {"SUB": 4, "num_warps_prep": 8},
    {"SUB": 4},
    {"PREP_DOT": "input"},
    {"ROWS": "split"},
    {"ROWS": "split", "COUPLE": "state"},
    {"BV": 16},
    {"BV": 64},
    {"num_stages": 3},
    {"SUB": 1, "BV": 16, "num_warps_state": 2, "maxnreg_prep": 128},
]
D = 128


def compile_intra(kernel, kn: dict) -> dict:
    sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "g_ptr": "*fp32", "beta_ptr": "*bf16",
           "wq_ptr": "*bf16", "uo_ptr": "*bf16", "kg_ptr": "*bf16", "mn_ptr": "*bf16", "gl_ptr": "*fp32",
           "T": "i32", "H": "i32", "NS": "i32", "scale": "fp32"}
    consts = {"K": D, "V": D, "C": kernel.C, "SUB": kn["SUB"], "CLAMP": kernel.CLAMP, "PREP_DOT": kn["PREP_DOT"],
              "COUPLE": kn["COUPLE"] if kn["SUB"] > 1 else "state"}
    return compile_sm90(kernel._kda_intra, sig, consts, {"num_warps": kn["num_warps_prep"], "num_stages": 1,
                                                           "maxnreg": kn["maxnreg_prep"]})


def compile_recur(kernel, kn: dict) -> dict:
    sig = {"wq_ptr": "*bf16", "uo_ptr": "*bf16", "kg_ptr": "*bf16", "mn_ptr": "*bf16", "gl_ptr": "*fp32",
           "o_ptr": "*bf16", "h0_ptr": "*fp32", "ht_ptr": "*fp32", "T": "i32", "H": "i32", "NS": "i32"}
    consts = {"K": D, "V": D, "C": kernel.C, "SUB": kn["SUB"], "BV": min(kn["BV"], D), "ROWS": kn["ROWS"],
              "COUPLED": kn["COUPLE"] == "prep" and kn["SUB"] > 1,
              "HAS_H0": False,
              "HAS_HT": False}
    return compile_sm90(kernel._kda_recur, sig, consts,
                        {"num_warps": kn["num_warps_state"], "num_stages": kn["num_stages"]})


def main() -> int:
    import triton

    from baselines.kda import kernel

    ap = argparse.ArgumentParser()
    ap.add_argument("--knobs", action="append", default=[])
    a = ap.parse_args()
    print(f"# triton {triton.__version__}", flush=True)
    for over in [json.loads(k) for k in a.knobs] or DEFAULT:
        kn = {**kernel.KNOBS, **over}
        for name, fn in (("intra", compile_intra), ("recur", compile_recur)):
            rep = fn(kernel, kn)
            print(json.dumps({"kernel": name, "over": over, **{k: v for k, v in rep.items() if k != "knobs"},
                              "launch": rep.get("knobs")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
