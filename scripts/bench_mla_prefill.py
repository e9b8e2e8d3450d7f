"""mla_prefill kernel designs on the GPU: check each variant against the fp64 oracle on the primary shape and
every distribution (NaN-poisoned outputs, two runs compared bit for bit), then time them and torch-ref by
device time (gpu_worker.devicetime: one CUDA graph per rotated input copy, median).

    python scripts/bench_mla_prefill.py [--variants JSON_LIST] [--previous FILE] [--reps 5]
        [--time-dists unit] [--smoke] [--no-torch] [--budget-s 140] [--cpu]

--variants: a JSON list of [name, knob overrides(, [[old, new], ...] source patches)]; default: the built-in
list below (the earlier default, the present default and five neighbours). --previous FILE: a template
(a kernel.py with a KNOBS line, e.g. `git show REV:baselines/mla_prefill/kernel.py`) that the variant named
"previous" is rendered from instead of the present template. --smoke: one call of each variant, with its
registers, spills and shared memory. Every variant is checked on every distribution; --time-dists says
which are timed (a call is ~10 ms, its time does not depend on the distribution's scale). --budget-s: once
this many seconds have passed, the variants not yet timed are reported as skipped (the bench stays bounded).
--cpu: a dry run of the whole script on the cpu_shape under the Triton interpreter (wall times, no GPU).
Prints a table: variant, distribution, rel-RMS error, NaN, deterministic, device ms (median, IQR); then each
variant's worst timed distribution and its ratio to the first variant's. A variant that fails to compile or
launch is reported and left out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from baselines.problem import default_knobs, render  # noqa: E402

# knob overrides of the template's defaults; the first is the reference of the last table
PREVIOUS = {"BLOCK_H": 1, "BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_DV": 1, "TMA": False, "num_stages": 2,
            "num_warps": 8}
VARIANTS = [
    ["previous", PREVIOUS],  # one head, all 512 columns, 8 warps (both warp groups compute the scores)
    ["default", {}],  # 2 heads x 64 queries, SPLIT_DV 2, 8 warps, BLOCK_N 32, 2 stages, by pointers
    ["default-tma", {"TMA": True}],  # the same by tensor descriptors
    ["n64-s1", {"BLOCK_N": 64, "num_stages": 1}],  # 64-column score instructions, one stage (216 KiB)
    ["h4-m32", {"BLOCK_H": 4, "BLOCK_M": 32}],  # 4 heads x 32 queries: the same resources, a 32-row diagonal
    ["w4-s1-tma", {"BLOCK_H": 1, "num_warps": 4, "num_stages": 1, "TMA": True}],  # 110 KiB: 2 programs per SM
    ["dv1-n32-s4-tma", {"BLOCK_H": 1, "SPLIT_DV": 1, "num_stages": 4, "TMA": True}],  # the previous layout
]


def load(source, knobs, tmp, i, patches=()):
    """`source` (a template) rendered with `knobs`, every [old, new] of `patches` replaced (experiments)."""
    src = render(source, knobs)
    for old, new in patches:
        assert src.count(old) >= 1, old
        src = src.replace(old, new)
    path = Path(tmp) / f"cand_{i}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"cand_{i}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_variants(variants, template: str, previous: str | None, tmp) -> list:
    """[(name, knobs, module)]: the variant named "previous" rendered from `previous` when given (only the
    knobs that template has), every other one from `template`."""
    out = []
    for i, v in enumerate(variants):
        name, kn = v[0], v[1]
        src = previous if name == "previous" and previous else template
        kn = {k: x for k, x in kn.items() if k in default_knobs(src)}
        out.append((name, kn, load(src, kn, tmp, i, v[2] if len(v) > 2 else ())))
    return out


def wall_time_ms(call, sets: list, reps: int) -> dict:
    """--cpu: median wall milliseconds of `call` over the sets (the interpreter: a check of the script, not a
    measurement)."""
    times = []
    for i in range(reps):
        t = time.perf_counter()
        call(sets[i % len(sets)])
        times.append(1e3 * (time.perf_counter() - t))
    times.sort()
    return {"ms": times[len(times) // 2], "iqr_ms": (times[len(times) // 4], times[(3 * len(times)) // 4]),
            "mode": "wall", "copies": len(sets)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=None)
    ap.add_argument("--previous", default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--time-dists", default="unit")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--budget-s", type=float, default=140.0)
    ap.add_argument("--cpu", action="store_true", help="the cpu_shape under the Triton interpreter (a dry run)")
    a = ap.parse_args(argv)
    if a.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    from baselines.problem import rel_rms
    from baselines.registry import get_problem
    from gpu_worker.devicetime import graph_time_ms, rotated_copies

    t0 = time.monotonic()
    variants = json.loads(a.variants) if a.variants else VARIANTS
    prob = get_problem("mla_prefill")
    dev = "cpu" if a.cpu else "cuda"
    shape = prob.cpu_shape if a.cpu else prob.shapes[0]
    if a.cpu:
        print(f"# CPU, Triton interpreter, torch {torch.__version__}, {shape.name}", flush=True)
    else:
        props = torch.cuda.get_device_properties(0)
        print(f"# {props.name}, {props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MiB, "
              f"torch {torch.__version__}, triton {__import__('triton').__version__}, {shape.name}", flush=True)
    previous = Path(a.previous).read_text() if a.previous else None
    print(f"# previous: {a.previous if previous else 'the present template'} at {PREVIOUS}", flush=True)
    mods = load_variants(variants, prob.template(), previous, tempfile.mkdtemp())
    out_shape = (shape["N"], shape["H"], shape["DL"])
    out_dtype = torch.float32 if a.cpu else torch.bfloat16

    def sync():
        if not a.cpu:
            torch.cuda.synchronize()

    def inputs(dist, seed):
        return prob.make_inputs(shape, dist, seed, dev, cpu=a.cpu)

    def call(name, mod, inp):
        """One call into a fresh NaN-filled output; None (reported) when it does not compile or launch."""
        out = torch.full(out_shape, float("nan"), device=dev, dtype=out_dtype)
        try:
            mod.run(inp, {"o": out})
            sync()
        except Exception as e:  # noqa: BLE001 - trusted bench code: report and go on
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            return None
        return out

    if a.smoke:
        inp = inputs("unit", 1)
        ref = prob.oracle(inp)["o"]
        for name, kn, mod in mods:
            t = time.monotonic()
            out = call(name, mod, inp)
            if out is None:
                continue
            info = {k: (getattr(v, "n_regs", None), getattr(v, "n_spills", None),
                        getattr(getattr(v, "metadata", None), "shared", None)) for k, v in mod.LAUNCHED.items()}
            print(f"smoke {name:<14} err {rel_rms(ref, out):.3e} regs/spills/smem {info} "
                  f"(first call {time.monotonic() - t:.1f} s)", flush=True)
        return 0

    # correctness on every distribution: fresh inputs, NaN-poisoned outputs, two runs bit-identical
    errs = {}
    for dist in prob.distributions:
        inp = inputs(dist, 7)
        ref = prob.oracle(inp)["o"]
        if not a.no_torch:
            errs["torch-ref", dist] = (rel_rms(ref, prob.baselines()["torch-ref"](inp)["o"]), False, True)
        for name, kn, mod in list(mods):
            outs = [call(name, mod, inp) for _ in range(2)]
            if outs[0] is None or outs[1] is None:
                mods = [m for m in mods if m[0] != name]
                continue
            errs[name, dist] = (rel_rms(ref, outs[0]), bool(torch.isnan(outs[0]).any()),
                                bool(torch.equal(outs[0], outs[1])))
            print(f"check {name:<14} {dist:<7} err {errs[name, dist][0]:.3e} nan {int(errs[name, dist][1])} "
                  f"det {int(errs[name, dist][2])} ({time.monotonic() - t0:.0f} s)", flush=True)
        del inp, ref

    rows = []
    for dist in a.time_dists.split(","):
        sets = [inputs(dist, 9000 + i) for i in range(2)] if a.cpu else rotated_copies(lambda i: inputs(dist, 9000 + i))
        sets = [{"inputs": s, "out": {"o": torch.empty(out_shape, device=dev, dtype=out_dtype)}} for s in sets]
        timer = wall_time_ms if a.cpu else graph_time_ms
        timed = [("torch-ref", prob.baselines()["torch-ref"])] if not a.no_torch else []
        timed += [(name, mod.run) for name, _kn, mod in mods]
        for name, fn in timed:
            if time.monotonic() - t0 > a.budget_s:
                print(f"{name} {dist}: skipped, past --budget-s {a.budget_s:.0f}", flush=True)
                continue
            if name == "torch-ref":
                t = timer(lambda s: fn(s["inputs"]), sets, reps=a.reps)
            else:
                t = timer(lambda s, fn=fn: fn(s["inputs"], s["out"]), sets, reps=a.reps)
            rows.append((name, dist, t))
            print(f"time {name:<14} {dist:<7} {t['ms']:.3f} ms ({time.monotonic() - t0:.0f} s)", flush=True)
        del sets
        if not a.cpu:
            torch.cuda.empty_cache()

    print(f"\n{'variant':<14} {'dist':<7} {'err':>9} {'nan':>4} {'det':>4} {'ms':>8} {'iqr ms':>15} mode")
    for name, dist, t in rows:
        err, nan, same = errs.get((name, dist), (float("nan"), False, True))
        lo, hi = t["iqr_ms"]
        print(f"{name:<14} {dist:<7} {err:9.2e} {int(nan):>4} {int(same):>4} {t['ms']:8.3f} {lo:7.3f}-{hi:7.3f} "
              f"{t['mode']}/{t['copies']}")
    worst = {}
    for name, _d, t in rows:
        worst[name] = max(worst.get(name, 0.0), t["ms"])
    ref = worst.get(variants[0][0])
    print(f"\n{'variant':<14} {'worst ms':>9} {'x first':>8} {'TFLOP/s':>8}")
    for name, ms in worst.items():
        print(f"{name:<14} {ms:9.3f} {ms / ref if ref else float('nan'):8.3f} {prob.flops(shape) / ms / 1e9:8.1f}")
    print(f"# {time.monotonic() - t0:.0f} s in all", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
