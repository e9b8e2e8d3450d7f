"""KDA on one GPU: correctness of the starting kernel (vs the fp64 oracle and vs FLA) and timing against FLA.

Run from the repository root on a CUDA host where FLA (fla-core) is installed:
    python scripts/gpu_kda.py [--variants N] [--shapes all|primary]
Writes the full log and a JSON of every number to $OUT (default ./out_kda). The last lines are a short table.
Timing: triton.testing.do_bench, median, warmup 25 ms / rep 100 ms; do_bench zeroes a 256 MB buffer before each
repetition, so L2 (60 MB) is flushed between calls (inputs of the primary shape are ~400 MB anyway).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("FLA_FLASH_KDA", "0")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from baselines.kda.spec import PROBLEM as P  # noqa: E402
from baselines.problem import Shape, rel_rms  # noqa: E402

OUT = os.environ.get("OUT", "out_kda")
os.makedirs(OUT, exist_ok=True)
LOG = open(os.path.join(OUT, "gpu_kda.log"), "w")
RESULTS: dict = {"env": {}, "correct": [], "timing": []}


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.write(s + "\n")
    LOG.flush()


_N = [0]


def load(knobs: dict):
    """Render the template and import it from a real file (Triton's JIT reads the source with inspect)."""
    import importlib.util
    import tempfile

    _N[0] += 1
    path = os.path.join(tempfile.mkdtemp(prefix="kda_"), f"kda_candidate_{_N[0]}.py")
    with open(path, "w") as f:
        f.write(P.render(knobs))
    spec = importlib.util.spec_from_file_location(f"kda_candidate_{_N[0]}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def alloc(shape: Shape):
    return {n: torch.full(s.shape, float("nan"), dtype=getattr(torch, s.dtype), device="cuda")
            for n, s in P.output_specs(shape).items()}


def fla_run(inputs):
    from baselines.kda.baseline import fla_chunk_kda

    return fla_chunk_kda(inputs)


VARIANTS = [
    {},
    {"BK": 64},
    {"num_warps_prep": 4},
    {"CHUNK": 32},
    {"SOLVE_PREC": "tf32x3"},
    {"FAST": False},
    {"BV": 64, "num_warps_state": 8},
    {"num_stages": 2},
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", type=int, default=len(VARIANTS))
    ap.add_argument("--shapes", default="all")
    args = ap.parse_args()
    variants = VARIANTS[: args.variants]
    env = {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name(),
           "FLA_FLASH_KDA": os.environ.get("FLA_FLASH_KDA")}
    try:  # the version from package metadata: FLA itself is imported only by baselines/kda/baseline.py
        from importlib.metadata import version

        env["fla"] = version("fla-core")
    except Exception as e:  # noqa: BLE001
        env["fla"] = f"unavailable: {e}"
    RESULTS["env"] = env
    log("env", env)

    # ---- 1. correctness vs the fp64 oracle at moderate T (tail chunk, initial state) -------------------
    mods = {}
    for kn in variants:
        try:
            mods[repr(kn)] = load(kn)
        except Exception:  # noqa: BLE001
            log("load failed", kn, traceback.format_exc())
    small = Shape("B2 T1000 H4 D128 state", {"B": 2, "T": 1000, "H": 4, "D": 128, "state": 1})
    for dist in P.distributions:
        x = P.make_inputs(small, dist, 7, "cuda")
        ref = P.oracle(x)
        try:
            fo = fla_run(x)
            fe = {n: rel_rms(ref[n], fo[n]) for n in ref}
        except Exception:  # noqa: BLE001
            fe = {"error": traceback.format_exc(limit=2)}
        log(f"[oracle T1000] {dist:6s} FLA {fe}")
        RESULTS["correct"].append({"shape": small.name, "dist": dist, "who": "fla", "err": fe})
        for name, mod in mods.items():
            try:
                out = alloc(small)
                mod.run(x, out)
                torch.cuda.synchronize()
                e = {n: rel_rms(ref[n], out[n]) for n in ref}
            except Exception:  # noqa: BLE001
                e = {"error": traceback.format_exc(limit=3)}
            log(f"[oracle T1000] {dist:6s} kernel {name} {e}")
            RESULTS["correct"].append({"shape": small.name, "dist": dist, "who": name, "err": e})

    # ---- 2. primary shape: kernel vs fp64 oracle and vs FLA --------------------------------------------
    prim = P.shapes[0]
    default = mods.get(repr({}))
    for dist in P.distributions:
        x = P.make_inputs(prim, dist, 11, "cuda")
        t0 = time.time()
        ref = P.oracle(x)
        torch.cuda.synchronize()
        t_or = time.time() - t0
        fo = fla_run(x)
        out = alloc(prim)
        default.run(x, out)
        torch.cuda.synchronize()
        row = {"shape": prim.name, "dist": dist, "oracle_s": t_or,
               "fla_vs_oracle": rel_rms(ref["o"], fo["o"]), "kernel_vs_oracle": rel_rms(ref["o"], out["o"]),
               "kernel_vs_fla": rel_rms(fo["o"], out["o"])}
        del ref
        log(f"[primary] {row}")
        RESULTS["correct"].append(row)

    # ---- 3. timing -----------------------------------------------------------------------------------
    shapes = P.shapes if args.shapes == "all" else [prim]
    table = []
    for sh in shapes:
        x = P.make_inputs(sh, "mild", 3, "cuda")
        try:
            t_fla = do_bench(lambda: fla_run(x), warmup=25, rep=100, return_mode="median")
        except Exception:  # noqa: BLE001
            t_fla = float("nan")
            log("fla timing failed", traceback.format_exc(limit=2))
        table.append((sh.name, "fla.chunk_kda", t_fla, ""))
        log(f"[time] {sh.name} fla.chunk_kda {t_fla:.4f} ms")
        for name, mod in mods.items():
            if sh is not prim and name != repr({}):
                continue
            out = alloc(sh)
            try:
                t = do_bench(lambda: mod.run(x, out), warmup=25, rep=100, return_mode="median")
                extra = ""
                if sh is prim:
                    tp = do_bench(lambda: mod.forward(x, out, state=False), warmup=25, rep=100, return_mode="median")
                    ts = do_bench(lambda: mod.forward(x, out, prep=False), warmup=25, rep=100, return_mode="median")
                    extra = f"prep {tp:.3f} state {ts:.3f}"
            except Exception:  # noqa: BLE001
                t, extra = float("nan"), traceback.format_exc(limit=2).replace("\n", " | ")[-300:]
            table.append((sh.name, name, t, extra))
            log(f"[time] {sh.name} {name} {t:.4f} ms {extra}")
        # strong gates at the primary shape (level path) for the default knobs
        if sh is prim and default is not None:
            xs = P.make_inputs(sh, "strong", 3, "cuda")
            out = alloc(sh)
            t = do_bench(lambda: default.run(xs, out), warmup=25, rep=100, return_mode="median")
            table.append((sh.name, "{} strong gates", t, ""))
            t = do_bench(lambda: fla_run(xs), warmup=25, rep=100, return_mode="median")
            table.append((sh.name, "fla strong gates", t, ""))
        del x
        torch.cuda.empty_cache()
    RESULTS["timing"] = [dict(zip(("shape", "who", "ms", "extra"), r)) for r in table]
    with open(os.path.join(OUT, "gpu_kda.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    log("\n=== KDA timing (median ms, do_bench, L2 flushed) ===")
    for sh, who, t, extra in table:
        log(f"{sh:26s} {who:44s} {t:8.4f}  {extra}")


if __name__ == "__main__":
    main()
