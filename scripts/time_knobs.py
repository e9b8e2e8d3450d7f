"""Check and time settings of a problem's template on one GPU, by device time, before a search or after a
new design: each setting rendered from the template, checked against the fp64 oracle with the harness's
tolerance on every distribution, then timed beside the primary baseline.

    python scripts/time_knobs.py PROBLEM [--shape I] [--knobs JSON ...] [--knobs-file FILE]
                                 [--baseline NAME] [--template FILE] [--out FILE]

`--knobs` (repeatable) and each line of `--knobs-file` override the template's defaults; with neither,
the defaults alone. `--template` renders another template of the problem instead of its kernel.py (a new
design written beside the starting kernel, e.g. baselines/kda/scan_kernel.py), with that file's knobs.
`--baseline` picks which of the problem's baselines the tolerance and the timing are taken against (default: the primary); each row carries that baseline's own error. Timing: gpu_worker.devicetime (one CUDA graph per rotated input copy, together more
than the harness's L2 flush reads, replayed back to back), medians; trusted code only, as it neither refills inputs nor checks
timed outputs (the harness does both when it judges a candidate). Without CUDA the settings are checked
under the Triton interpreter on the CPU shape and not timed. One JSON line per setting and distribution,
then a table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def settings(args) -> list[dict]:
    out = [json.loads(k) for k in args.knobs]
    if args.knobs_file:
        out += [json.loads(ln) for ln in Path(args.knobs_file).read_text().splitlines() if ln.strip()]
    return out or [{}]


def load(source: str, tmp: str, i: int):
    path = Path(tmp) / f"setting_{i}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--shape", type=int, default=0, help="index into the problem's shapes (GPU only)")
    ap.add_argument("--knobs", action="append", default=[], help="JSON object of knob overrides")
    ap.add_argument("--knobs-file", help="one JSON object of knob overrides per line")
    ap.add_argument("--baseline", help="one of the problem's baselines (default: the primary)")
    ap.add_argument("--template", help="a template file to render instead of the problem's kernel.py")
    ap.add_argument("--out", help="also write the JSON lines here")
    a = ap.parse_args(argv)
    cuda = os.environ.get("TRITON_INTERPRET") != "1" and _cuda()
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    from baselines.problem import default_knobs, rel_rms, render
    from baselines.registry import check_problem_name, get_problem

    prob = get_problem(check_problem_name(a.problem))
    shape = prob.shapes[a.shape] if cuda else prob.cpu_shape
    device = "cuda" if cuda else "cpu"
    bases = prob.baselines()
    if a.baseline and a.baseline not in bases:
        ap.error(f"{prob.name} has the baselines {', '.join(bases)}, not {a.baseline!r}")
    base = (a.baseline, bases[a.baseline]) if a.baseline else next(iter(bases.items()))
    template = Path(a.template).read_text() if a.template else prob.template()
    rows, lines = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, over in enumerate(settings(a)):
            try:
                mod = load(render(template, {**default_knobs(template), **over}), tmp, i)
            except Exception as e:  # noqa: BLE001 - an invalid setting is reported, the rest go on
                rows.append({"knobs": over, "error": f"{type(e).__name__}: {e}"[:300]})
                continue
            for dist in prob.distributions:
                row = {"knobs": over, "shape": shape.name, "dist": dist}
                try:
                    row.update(_check(prob, shape, dist, mod, base[1], device, not cuda, torch, rel_rms))
                    if cuda and row["ok"]:
                        row.update(_time(prob, shape, dist, mod, base[1]))
                except Exception as e:  # noqa: BLE001 - a setting that fails to compile or run is reported
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                rows.append(row)
                lines.append(json.dumps(row))
                print(lines[-1], flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"\n{prob.name} {shape.name}, baseline {base[0]}" + ("" if cuda else " (interpreter: not timed)"))
    for r in rows:
        if "error" in r:
            print(f"{json.dumps(r['knobs']):<60} {r.get('dist', ''):<8} error: {r['error']}")
            continue
        t = (f"{r['ms']:.4g} ms vs {r['baseline_ms']:.4g} ms ({r['baseline_ms'] / r['ms']:.3f}x)"
             if "ms" in r else "")
        print(f"{json.dumps(r['knobs']):<60} {r['dist']:<8} {'ok ' if r['ok'] else 'FAIL'} "
              f"err {r['err']:.2e} (baseline {r['baseline_err']:.2e}, tol {r['tol']:.2e})  {t}")
    return 0 if all(r.get("ok") for r in rows) else 1


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def _check(prob, shape, dist, mod, baseline, device, cpu, torch, rel_rms) -> dict:
    inputs = prob.make_inputs(shape, dist, 0, device, cpu=cpu)
    out = {k: torch.full(o.shape, float("nan"), dtype=getattr(torch, o.dtype), device=device)
           for k, o in prob.output_specs(shape, cpu=cpu).items()}
    mod.run(inputs, out)
    ref, base = prob.oracle(inputs), baseline(inputs)
    worst = {"ok": True, "err": 0.0, "tol": float("inf"), "baseline_err": None}
    for k, o in out.items():
        base_err = rel_rms(ref[k], base[k])
        tol = max(prob.tolerance_floor, prob.tolerance_alpha * base_err)
        err = rel_rms(ref[k], o)
        ok = bool(torch.isfinite(o).all()) and err <= tol
        if not ok or err / tol > worst["err"] / worst["tol"]:
            worst = {"ok": worst["ok"] and ok, "err": err, "tol": tol, "baseline_err": base_err}
    return worst


def _time(prob, shape, dist, mod, baseline) -> dict:
    import torch

    from gpu_worker.devicetime import graph_time_ms, rotated_copies

    inputs = rotated_copies(lambda i: prob.make_inputs(shape, dist, 100 + i, "cuda"))
    sets = [{"inputs": x, "out": {k: torch.empty(o.shape, dtype=getattr(torch, o.dtype), device="cuda")
                                  for k, o in prob.output_specs(shape).items()}} for x in inputs]
    mine = graph_time_ms(lambda s: mod.run(s["inputs"], s["out"]), sets)
    theirs = graph_time_ms(lambda s: baseline(s["inputs"]), sets)
    return {"ms": mine["ms"], "mode": mine["mode"], "baseline_ms": theirs["ms"], "baseline_mode": theirs["mode"]}


if __name__ == "__main__":
    sys.exit(main())
