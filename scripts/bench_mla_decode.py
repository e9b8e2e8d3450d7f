"""mla_decode kernel designs on the GPU: check each knob setting against the fp64 oracle on both shapes and
every distribution (NaN-poisoned outputs, two runs compared bit for bit), then time them and torch-bmm by
device time (gpu_worker.devicetime: one CUDA graph per rotated input copy, together >= 2x L2, median).

    python scripts/bench_mla_decode.py [--variants JSON_LIST] [--reps 100] [--smoke] [--only-shape 0]
        [--dists unit,small,peaked] [--time-dists unit] [--no-torch] [--no-floor]

--variants: a JSON list of [name, knob overrides(, [[old, new], ...] source patches)]; default: the
built-in list below (the defaults first, then PREFETCH, the one-launch design and neighbours).
--dists: the distributions checked for errors; --time-dists: those timed (each timed distribution adds
one graph-timing pass per variant). --smoke: one call of each variant on each shape, with its registers,
spills and shared memory (run it under `timeout` first: a broken grid barrier hangs, it does not fail).
The launch floor (unless --no-floor): empty kernels timed the same way, one launch of 128 programs and two
launches with the second a programmatic dependent (PDL) of the first: what the measurement charges any
one- or two-kernel design before it does any work.
Prints a table: variant, shape, distribution, rel-RMS error (kernel / torch-bmm), device µs (median, IQR);
then per shape each variant's worst timed distribution and its ratio to the first variant's. A variant that
fails to compile or launch is reported and left out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ONE_LAUNCH = {"FUSED": True, "REDUCE_D": 256, "COMBINE_TILE": 16384}  # one reduction round trip per program
VARIANTS = [  # knob overrides of the template's defaults (the first: the defaults, which the others are compared to)
    ["default", {}],  # two kernels, tiles streamed from HBM by the pipeline
    ["prefetch", {"PREFETCH": True}],  # the split's rows prefetched into L2 before q loads
    ["n64-s2", {"BLOCK_N": 64, "num_stages": 2}],  # half the q re-reads per key, one tile in flight (from L2)
    ["two-per-sm", {"GRID": 256, "num_stages": 1}],  # 110 KB shared: two programs per SM, twice the splits
    # Q4: two warp groups of 64 rows per program, half the tile reads from L2, 2 stages (q takes 147 KB);
    # Q1 (64 rows): 64-row blocks at 8 warps, the score tile split across the warp groups
    ["h128-w8-s2", {"BLOCK_H": 128, "num_warps": 8, "num_stages": 2}],
    # 128-key tiles (Q1: one per program), no pipeline: the tile comes from L2; 8 warps split the 64 x 128
    # scores into two 64 x 64 halves (q read from shared memory a quarter as often per key as at BLOCK_N 32)
    ["n128-w8-s1", {"BLOCK_N": 128, "num_warps": 8, "num_stages": 1}],
    ["fused", ONE_LAUNCH],  # one launch: partials, grid barrier, one-step reduction
]


def load(prob, knobs, tmp, i, patches=()):
    """The template rendered with `knobs`, every [old, new] of `patches` replaced (experiments only)."""
    src = prob.render(knobs)
    for old, new in patches:
        assert src.count(old) >= 1, old
        src = src.replace(old, new)
    path = Path(tmp) / f"cand_{i}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"cand_{i}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@triton.jit
def _empty_first(x_ptr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _empty_second(x_ptr):
    tl.extra.cuda.gdc_wait()


def launch_floor(reps: int) -> dict:
    """Device time of empty kernels replayed as CUDA graphs like the variants (gpu_worker.devicetime):
    one launch of 128 programs, and two with the second (256 programs) a PDL dependent of the first."""
    import torch

    x = torch.zeros(1, device="cuda")

    def one(_s):
        _empty_first[(128,)](x, PDL=False, num_warps=4)

    def two(_s):
        _empty_first[(128,)](x, PDL=True, num_warps=4)
        _empty_second[(256,)](x, num_warps=4, launch_pdl=True)

    return {"floor-1-launch": graph_time(one, reps), "floor-2-launch-pdl": graph_time(two, reps)}


def graph_time(call, reps: int) -> dict:
    from gpu_worker.devicetime import graph_time_ms

    return graph_time_ms(call, [None, None], reps=reps)


def main(argv=None) -> int:
    import torch

    from baselines.problem import rel_rms
    from baselines.registry import get_problem
    from gpu_worker.devicetime import graph_time_ms, rotated_copies

    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=None)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only-shape", type=int, action="append", default=[])
    ap.add_argument("--dists", default="unit,small,peaked")
    ap.add_argument("--time-dists", default="unit")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-floor", action="store_true")
    a = ap.parse_args(argv)
    variants = json.loads(a.variants) if a.variants else VARIANTS
    prob = get_problem("mla_decode")
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, {props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MiB, "
          f"torch {torch.__version__}, triton {__import__('triton').__version__}", flush=True)
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp()
    mods = [(v[0], v[1], load(prob, v[1], tmp, i, v[2] if len(v) > 2 else ())) for i, v in enumerate(variants)]
    shapes = [prob.shapes[i] for i in (a.only_shape or range(len(prob.shapes)))]

    def fresh_out(shape):
        return torch.full((shape["Q"], shape["H"], shape["DL"]), float("nan"), device="cuda", dtype=torch.bfloat16)

    if a.smoke:
        for shape in shapes:
            inp = prob.make_inputs(shape, "unit", 1, "cuda")
            ref = prob.oracle(inp)["o"]
            for name, kn, mod in mods:
                out = fresh_out(shape)
                try:  # a setting that does not compile or launch (e.g. over the shared memory) is reported
                    mod.run(inp, {"o": out})
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - trusted bench code: report and go on
                    print(f"smoke {name:<14} {shape.name:<16} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                info = {k: (getattr(v, "n_regs", None), getattr(v, "n_spills", None),
                            getattr(getattr(v, "metadata", None), "shared", None))
                        for k, v in mod.LAUNCHED.items()}
                print(f"smoke {name:<14} {shape.name:<16} err {rel_rms(ref, out):.3e} regs/spills/smem {info}",
                      flush=True)
        return 0
    floor = {} if a.no_floor else launch_floor(a.reps)
    for name, t in floor.items():
        print(f"{name}: {1e3 * t['ms']:.2f} us", flush=True)
    base = prob.baselines()["torch-bmm"]
    timed = a.time_dists.split(",")
    rows = []
    for shape in shapes:
        for dist in dict.fromkeys(a.dists.split(",") + timed):
            # correctness: fresh inputs, NaN-poisoned outputs, two runs bit-identical
            inp = prob.make_inputs(shape, dist, 7, "cuda")
            ref = prob.oracle(inp)["o"]
            berr = rel_rms(ref, base(inp)["o"])
            errs = {}
            for name, kn, mod in list(mods):
                outs = []
                try:  # a setting that does not compile or launch is reported and left out from here on
                    for _ in range(2):
                        out = fresh_out(shape)
                        mod.run(inp, {"o": out})
                        outs.append(out)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - trusted bench code: report and go on
                    print(f"{name} {shape.name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                    mods = [m for m in mods if m[0] != name]
                    continue
                nan = bool(torch.isnan(outs[0]).any())
                same = bool(torch.equal(outs[0], outs[1]))
                errs[name] = (rel_rms(ref, outs[0]), nan, same)
            if dist not in timed:
                rows.append(("torch-bmm", shape.name, dist, berr, False, True, None))
                rows.extend((name, shape.name, dist, *errs[name], None) for name, _kn, _m in mods)
                continue
            sets = rotated_copies(lambda i: prob.make_inputs(shape, dist, 9000 + i, "cuda"))
            sets = [{"inputs": s, "out": {"o": torch.empty((shape["Q"], shape["H"], shape["DL"]), device="cuda",
                                                            dtype=torch.bfloat16)}} for s in sets]
            if not a.no_torch:
                t = graph_time_ms(lambda s: base(s["inputs"]), sets, reps=a.reps)
                rows.append(("torch-bmm", shape.name, dist, berr, False, True, t))
                print(rows[-1], flush=True)
            for name, kn, mod in mods:
                t = graph_time_ms(lambda s, mod=mod: mod.run(s["inputs"], s["out"]), sets, reps=a.reps)
                rows.append((name, shape.name, dist, *errs[name], t))
                print(rows[-1], flush=True)
            del sets
            torch.cuda.empty_cache()
    print(f"\n{'variant':<16} {'shape':<17} {'dist':<7} {'err':>9} {'nan':>4} {'det':>4} {'us':>7} {'iqr us':>13} mode")
    for name, sh, dist, err, nan, same, t in rows:
        if t is None:
            print(f"{name:<16} {sh:<17} {dist:<7} {err:9.2e} {int(nan):>4} {int(same):>4} {'-':>7}")
            continue
        lo, hi = t["iqr_ms"]
        print(f"{name:<16} {sh:<17} {dist:<7} {err:9.2e} {int(nan):>4} {int(same):>4} {1e3 * t['ms']:7.2f} "
              f"{1e3 * lo:6.2f}-{1e3 * hi:6.2f} {t['mode']}/{t['copies']}")
    # per shape: each variant's worst timed distribution, and its ratio to the first variant's (the reference)
    print(f"\n{'variant':<16} {'shape':<17} {'worst us':>9} {'x first':>8}")
    for sh in dict.fromkeys(r[1] for r in rows):
        worst = {}
        for name, rsh, _d, _e, _n, _s, t in rows:
            if rsh == sh and t is not None:
                worst[name] = max(worst.get(name, 0.0), 1e3 * t["ms"])
        ref = worst.get(variants[0][0])
        for name, us in worst.items():
            print(f"{name:<16} {sh:<17} {us:9.2f} {us / ref if ref else float('nan'):8.3f}")
    for name, t in floor.items():
        print(f"{name:<34} {1e3 * t['ms']:9.2f}")
    print(f"# {time.monotonic() - t0:.0f} s", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
