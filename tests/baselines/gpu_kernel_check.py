"""A starting kernel on the GPU, compiled (not interpreted), against the fp64 oracle with the harness's
tolerance. Runs in a process of its own: Triton decides at import time whether its jit functions are
interpreted, and the CPU tests of this suite import it with TRITON_INTERPRET=1.

    python -m tests.baselines.gpu_kernel_check PROBLEM CASES_JSON [KNOBS_JSON]

CASES_JSON: a list of [SHAPE_INDEX or SHAPE_NAME, DIST]; one process checks them all (one import of torch,
Triton and the baseline's library). Prints one JSON line: per case, per output, the kernel's and the
primary baseline's rel-RMS error, the tolerance, and whether the kernel left a NaN."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def check_all(problem: str, cases: list[tuple[int | str, str]], knobs: dict | None = None) -> list[dict]:
    """One child process for all `cases` ([shape index or name, distribution]); its result per case."""
    # the repository ahead of the inherited path, not instead of it: FLA may be installed only there
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": path}
    p = subprocess.run([sys.executable, "-m", "tests.baselines.gpu_kernel_check", problem,
                        json.dumps([list(c) for c in cases]), json.dumps(knobs or {})],
                       capture_output=True, text=True, timeout=600 + 300 * len(cases), cwd=REPO, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(got) == len(cases), got
    return got


def check(problem: str, shape_index: int | str, dist: str, knobs: dict | None = None) -> dict:
    return check_all(problem, [(shape_index, dist)], knobs)[0]


def main(argv: list[str]) -> int:
    import importlib.util
    import tempfile

    import torch

    from baselines.problem import rel_rms
    from baselines.registry import get_problem

    prob = get_problem(argv[0])
    knobs = {**prob.default_knobs(), **json.loads(argv[2] if len(argv) > 2 else "{}")}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel_under_test.py"
        path.write_text(prob.render(knobs))
        spec = importlib.util.spec_from_file_location("kernel_under_test", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for shape_ref, dist in json.loads(argv[1]):
            shape = prob.shapes[shape_ref] if isinstance(shape_ref, int) else prob.shape_named(shape_ref)
            inputs = prob.make_inputs(shape, dist, 0, "cuda")
            out = {k: torch.full(o.shape, float("nan"), dtype=getattr(torch, o.dtype), device="cuda")
                   for k, o in prob.output_specs(shape).items()}
            mod.run(inputs, out)
            torch.cuda.synchronize()
            ref = prob.oracle(inputs)
            base = next(iter(prob.baselines().values()))(inputs)
            res = {}
            for k, o in out.items():
                base_err = rel_rms(ref[k], base[k])
                res[k] = {"err": rel_rms(ref[k], o), "baseline_err": base_err, "nan": bool(torch.isnan(o).any()),
                          "tol": max(prob.tolerance_floor, prob.tolerance_alpha * base_err)}
            results.append(res)
            del inputs, out, ref, base
            torch.cuda.empty_cache()
    print(json.dumps(results))
    return 0


def assert_passes(res: dict, case=None) -> None:
    for k, r in res.items():
        assert not r["nan"] and r["err"] <= r["tol"], (case, k, r)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
