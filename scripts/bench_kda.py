"""kda kernel designs on the GPU: check each knob setting against the fp64 oracle on the spec's GPU shapes and
every distribution (NaN-poisoned outputs, two runs compared bit for bit, the problem's tolerance against FLA's
own error on the same inputs), then time them and FLA's chunk_kda by device time (gpu_worker.devicetime: one
CUDA graph per rotated input copy, together >= 2x L2, median).

    python scripts/bench_kda.py [--variants JSON_LIST] [--reps 100] [--smoke] [--only-shape 0] [--dists mild]
        [--no-fla] [--parts] [--budget-s 140]

--variants: a JSON list of [name, knob overrides(, [[old, new], ...] source patches)]; default: the built-in
list below. --smoke: one call of each variant on each shape, with its registers, spills and shared memory per
kernel. --parts: also time each variant's two launches apart (prep alone, state pass alone on whatever the
intermediates hold) on the first shape. --budget-s: no new (shape, distribution) starts past this many seconds
from the start; what is left out is printed. Shapes run in the spec's order (the primary first).
Prints a table: variant, shape, distribution, rel-RMS error of o (and the final state), pass against the
tolerance (the harness's rule, max(floor, alpha x FLA's error); with --no-fla the floor alone, 2e-3, which bf16
kernels at about 3e-3 miss), device ms (median, IQR); then per shape each variant's worst distribution and its speedup over FLA.
A variant that fails to compile or launch is reported and left out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEVICE = "cuda"

VARIANTS = [  # knob overrides of the template's defaults
    ["default", {}],  # two sub-chunks a step coupled in the prep, padded rows, BV 32, mixed-precision prep
    ["prep-w8", {"num_warps_prep": 8, "maxnreg_prep": 168}],  # the same prep at 8 warps, 168 registers
    ["couple-state", {"COUPLE": "state", "maxnreg_prep": 168}],  # the coupling as a third product in the state
    # pass; its prep one sub-chunk a program at 168 registers (three programs an SM)
    ["sub4", {"SUB": 4, "num_warps_prep": 8}],  # 64-row steps: a quarter of the state pass's steps; its prep
    # one program per step at 8 warps (222 registers)
    ["sub1", {"SUB": 1, "maxnreg_prep": 128}],  # one sub-chunk a step: twice the steps, no in-step coupling;
    # its prep at 128 registers (four programs an SM)
    ["prep-bf16", {"PREP_DOT": "input"}],  # every prep product in bf16
    ["split-rows", {"ROWS": "split"}],  # Y split into 16-row blocks instead of padded operands
    ["bv16", {"BV": 16}],  # 256 state programs at H32
    ["bv64", {"BV": 64}],  # 64 state programs at H32, half the L2 re-reads
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


def empty_out(prob, shape, nan=True):
    import torch

    return {n: torch.full(s.shape, float("nan"), dtype=getattr(torch, s.dtype), device=DEVICE) if nan
            else torch.empty(s.shape, dtype=getattr(torch, s.dtype), device=DEVICE)
            for n, s in prob.output_specs(shape).items()}


def errors(prob, shape, ref, out) -> dict:
    from baselines.problem import rel_rms

    return {n: rel_rms(ref[n], out[n]) for n in prob.compared_outputs(shape)}


def main(argv=None) -> int:
    import torch

    from baselines.registry import get_problem
    from gpu_worker.devicetime import graph_time_ms, rotated_copies

    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=None)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only-shape", type=int, action="append", default=[])
    ap.add_argument("--dists", default="mild,strong")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--parts", action="store_true")
    ap.add_argument("--budget-s", type=float, default=140.0)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    variants = json.loads(a.variants) if a.variants else VARIANTS
    prob = get_problem("kda")
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, {props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MiB, "
          f"torch {torch.__version__}, triton {__import__('triton').__version__}", flush=True)
    tmp = tempfile.mkdtemp()
    mods = [(v[0], v[1], load(prob, v[1], tmp, i, v[2] if len(v) > 2 else ())) for i, v in enumerate(variants)]
    shapes = [prob.shapes[i] for i in (a.only_shape or range(len(prob.shapes)))]
    if a.smoke:
        for shape in shapes:
            inp = prob.make_inputs(shape, "strong", 1, DEVICE)
            ref = prob.oracle(inp)
            for name, _kn, mod in mods:
                out = empty_out(prob, shape)
                try:  # a setting that does not compile or launch is reported
                    mod.run(inp, out)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - trusted bench code: report and go on
                    print(f"smoke {name:<12} {shape.name:<24} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                info = {k: (getattr(v, "n_regs", None), getattr(v, "n_spills", None),
                            getattr(getattr(v, "metadata", None), "shared", None))
                        for k, v in mod.LAUNCHED.items()}
                errs = {n: f"{e:.2e}" for n, e in errors(prob, shape, ref, out).items()}
                print(f"smoke {name:<12} {shape.name:<24} err {errs} regs/spills/smem {info}", flush=True)
        return 0
    fla = None
    if not a.no_fla:
        from baselines.kda.baseline import FLA_ENV, fla_chunk_kda

        fla = fla_chunk_kda
    rows, skipped = [], []
    for si, shape in enumerate(shapes):
        for dist in a.dists.split(","):
            if time.monotonic() - t0 > a.budget_s:
                skipped.append(f"{shape.name} {dist}")
                continue
            # correctness: NaN-poisoned outputs, two runs bit-identical, against the fp64 oracle
            inp = prob.make_inputs(shape, dist, 7, DEVICE)
            ref = prob.oracle(inp)
            ferr = None
            if fla is not None:
                ferr = errors(prob, shape, ref, fla(inp))
            # the harness's rule: rel-RMS <= max(floor, alpha * the baseline's own error); the floor without FLA
            tol = {n: max(prob.tolerance_floor, prob.tolerance_alpha * (ferr[n] if ferr else 0.0))
                   for n in prob.compared_outputs(shape)}
            checks = {}
            for name, _kn, mod in list(mods):
                outs = []
                try:  # a setting that does not compile or launch is reported and left out from here on
                    for _ in range(2):
                        out = empty_out(prob, shape)
                        mod.run(inp, out)
                        outs.append(out)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - trusted bench code: report and go on
                    print(f"{name} {shape.name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                    mods = [m for m in mods if m[0] != name]
                    continue
                errs = errors(prob, shape, ref, outs[0])
                same = all(torch.equal(outs[0][n], outs[1][n]) for n in outs[0])
                ok = all(errs[n] <= tol[n] for n in errs)
                checks[name] = (errs, ok, same)
            del ref
            # timing: the checked set and perturbed copies of it (fresh noise, same laws) up to 2x L2
            gen = torch.Generator(device=DEVICE).manual_seed(9000 + si)
            sets = rotated_copies(lambda i: inp if i == 0 else prob.perturbed(inp, gen, dist))
            sets = [{"inputs": s, "out": empty_out(prob, shape, nan=False)} for s in sets]
            if fla is not None:
                t = graph_time_ms(lambda s: fla(s["inputs"]), sets, reps=a.reps)
                rows.append(("fla.chunk_kda", shape.name, dist, ferr, True, True, t))
                print(rows[-1], flush=True)
            for name, _kn, mod in mods:
                t = graph_time_ms(lambda s, mod=mod: mod.run(s["inputs"], s["out"]), sets, reps=a.reps)
                rows.append((name, shape.name, dist, *checks[name], t))
                print(rows[-1], flush=True)
                if a.parts and si == 0:
                    for part, kw in (("intra", {"state": False}), ("recur", {"prep": False})):
                        t = graph_time_ms(lambda s, mod=mod, kw=kw: mod.forward(s["inputs"], s["out"], **kw),
                                          sets, reps=a.reps)
                        rows.append((f"{name}:{part}", shape.name, dist, {}, True, True, t))
                        print(rows[-1], flush=True)
            del sets, inp
            torch.cuda.empty_cache()
    if fla is not None:
        print(f"# FLA environment {FLA_ENV}")
    print(f"\n{'variant':<18} {'shape':<24} {'dist':<7} {'err o':>9} {'err S':>9} {'ok':>3} {'det':>4} {'ms':>7} "
          f"{'iqr ms':>13} mode")
    for name, sh, dist, errs, ok, same, t in rows:
        lo, hi = t["iqr_ms"]
        eo = f"{errs['o']:9.2e}" if errs and "o" in errs else f"{'-':>9}"
        es = f"{errs['final_state']:9.2e}" if errs and "final_state" in errs else f"{'-':>9}"
        print(f"{name:<18} {sh:<24} {dist:<7} {eo} {es} {int(ok):>3} {int(same):>4} {t['ms']:7.3f} "
              f"{lo:6.3f}-{hi:6.3f} {t['mode']}/{t['copies']}")
    # per shape: each variant's worst distribution and its speedup over FLA's worst
    print(f"\n{'variant':<18} {'shape':<24} {'worst ms':>9} {'x FLA':>7}")
    for sh in dict.fromkeys(r[1] for r in rows):
        worst = {}
        for name, rsh, _d, _e, _ok, _s, t in rows:
            if rsh == sh:
                worst[name] = max(worst.get(name, 0.0), t["ms"])
        base = worst.get("fla.chunk_kda")
        for name, ms in worst.items():
            print(f"{name:<18} {sh:<24} {ms:9.3f} {base / ms if base else float('nan'):7.3f}")
    if skipped:
        print(f"# left out past the {a.budget_s:.0f} s budget: {', '.join(skipped)}")
    print(f"# {time.monotonic() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
