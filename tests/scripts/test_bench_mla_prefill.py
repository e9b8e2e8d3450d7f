"""scripts/bench_mla_prefill.py off the GPU: its built-in variants render, and each one is right under the
Triton interpreter on the cpu_shape for every distribution (one subprocess: TRITON_INTERPRET must be set
before triton is imported); a previous template gets only the knobs it has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
    """
    import json, os, re, sys, tempfile
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, os.path.join(sys.argv[1], "scripts"))
    import torch
    import bench_mla_prefill as bench
    from baselines.problem import rel_rms
    from baselines.registry import get_problem
    prob = get_problem("mla_prefill")
    template = prob.template()
    # a template without the TMA knob stands for an earlier kernel
    previous = re.sub(r'"TMA": (True|False), ', "", template)
    tmp = tempfile.mkdtemp()
    mods = bench.load_variants(bench.VARIANTS, template, previous, tmp)
    res = {"knobs": {name: kn for name, kn, _ in mods}, "runs": []}
    for name, kn, mod in mods:
        if name == "previous":
            continue  # its KNOBS lack TMA, which run() reads
        for seed, dist in enumerate(prob.distributions):
            inp = prob.make_inputs(prob.cpu_shape, dist, 40 + seed, "cpu", cpu=True)
            out = {"o": torch.full(prob.output_specs(prob.cpu_shape, cpu=True)["o"].shape, float("nan"))}
            mod.run(inp, out)
            res["runs"].append({"name": name, "dist": dist, "nan": bool(out["o"].isnan().any()),
                                "err": rel_rms(prob.oracle(inp)["o"], out["o"])})
    print(json.dumps(res))
    """
)


def test_built_in_variants_are_right_under_the_interpreter():
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT)], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_mla_prefill as bench

    names = [v[0] for v in bench.VARIANTS]
    assert names[0] == "previous" and "default" in names and len(set(names)) == len(names)
    assert res["knobs"]["previous"] == {k: v for k, v in bench.PREVIOUS.items() if k != "TMA"}
    assert res["knobs"]["default"] == {}
    assert len(res["runs"]) == 3 * (len(names) - 1)
    for r in res["runs"]:
        assert not r["nan"] and r["err"] < 1e-5, r
