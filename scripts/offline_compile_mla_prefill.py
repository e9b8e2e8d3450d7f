"""Compile the mla_prefill kernel for sm_90 without a GPU: shared memory, registers, spills (ptxas -v)
and whether wgmma was emitted, per knob setting of its search space. One JSON line per setting.

    python scripts/offline_compile_mla_prefill.py [--out FILE]
    python scripts/offline_compile_mla_prefill.py --template FILE [--knobs-file FILE] [--out FILE]

`--template` compiles another design of the problem written beside the starting kernel (e.g.
baselines/mla_prefill/split_scores_kernel.py): its kernel (the @triton.jit function taking o_ptr) rendered
with each line of `--knobs-file` (JSON knob overrides), or with every point of its KNOB_SPACE without one.

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


def compile_one(fn, knobs: dict, fixed: dict | None = None) -> dict:
    """`fn` at the primary shape (H 64, DL 512, DR 64): its constexpr parameters from `knobs`, then `fixed`
    (a template's module constants, e.g. BLOCK_M), EVEN_H True; pointers bf16, qk_scale fp32, the rest i32."""
    params = {p.name: p.is_constexpr for p in fn.params}
    given = {"H": 64, "DL": 512, "DR": 64, "EVEN_H": True, **(fixed or {}), **knobs}
    consts = {n: given[n] for n, c in params.items() if c}
    sig = {n: "*bf16" if n.endswith("_ptr") else "fp32" if n == "qk_scale" else "i32"
           for n, c in params.items() if not c}
    return compile_sm90(fn, sig, consts, knobs)


def template_kernel(path: Path, knobs: dict, tmp: str):
    """The template rendered with `knobs`, imported from a file (Triton's JIT wants source), and its launch
    kernel: the one @triton.jit function that takes o_ptr."""
    import importlib.util

    import triton

    from baselines.problem import render

    dest = Path(tmp) / f"template_{abs(hash(json.dumps(knobs, sort_keys=True)))}.py"
    dest.write_text(render(path.read_text(), knobs))
    spec = importlib.util.spec_from_file_location(dest.stem, dest)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fns = [f for f in vars(mod).values() if isinstance(f, triton.runtime.JITFunction) and "o_ptr" in f.arg_names]
    if len(fns) != 1:
        raise SystemExit(f"{path}: expected one @triton.jit kernel taking o_ptr, found {len(fns)}")
    return fns[0], mod


def main() -> int:
    from baselines.mla_prefill import kernel
    from baselines.registry import get_problem

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="also write the rows here as one JSON list")
    ap.add_argument("--template", type=Path, help="another design's template instead of kernel.py")
    ap.add_argument("--knobs-file", type=Path, help="with --template: one JSON object of knob overrides a line")
    a = ap.parse_args()
    if a.knobs_file and not a.template:
        ap.error("--knobs-file goes with --template")
    rows = []
    if a.template:
        import tempfile

        from baselines.problem import default_knobs, start_kernel_knobs

        source = a.template.read_text()
        if a.knobs_file:
            settings = [json.loads(ln) for ln in a.knobs_file.read_text().splitlines() if ln.strip()]
        else:
            space = start_kernel_knobs(source)[1]
            settings = [dict(zip(space, values)) for values in itertools.product(*space.values())]
        with tempfile.TemporaryDirectory() as tmp:
            for over in settings:
                knobs = {**default_knobs(source), **over}
                fn, mod = template_kernel(a.template, knobs, tmp)
                fixed = {n: getattr(mod, n) for n in ("BLOCK_M",) if hasattr(mod, n)}
                rows.append({"setting": over, **compile_one(fn, knobs, fixed)})
                print(json.dumps(rows[-1]), flush=True)
    else:
        space = get_problem("mla_prefill").knob_space()
        for values in itertools.product(*space.values()):
            rows.append(compile_one(kernel._mla_prefill_fwd, dict(zip(space, values))))
            print(json.dumps(rows[-1]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
