"""scripts/bench_mla_prefill.py off the GPU: the whole script as a dry run (--cpu: the cpu_shape under the
Triton interpreter) checks and times every built-in variant; a previous template gets only its own knobs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_mla_prefill as bench  # noqa: E402


def test_dry_run_checks_and_times_every_variant():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_mla_prefill.py"), "--cpu", "--reps", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "FAILED" not in proc.stdout, proc.stdout
    names = [v[0] for v in bench.VARIANTS]
    assert names[0] == "previous" and "default" in names and len(set(names)) == len(names)
    # the table: variant, dist, rel-RMS error against the fp64 oracle, NaN, deterministic, ms, ...
    rows = {m.group(1): m.groups()[1:] for m in
            re.finditer(r"^(\S+)\s+unit\s+(\S+)\s+(\d)\s+(\d)\s+\d", proc.stdout, re.MULTILINE)}
    assert set(rows) == {"torch-ref", *names}, proc.stdout
    for name, (err, nan, det) in rows.items():
        assert float(err) < 1e-5 and nan == "0" and det == "1", (name, err, nan, det)
    checks = re.findall(r"^check (\S+)\s+(\S+)\s+err", proc.stdout, re.MULTILINE)
    assert len(checks) == len(names) * 3  # every variant on every distribution


def test_a_previous_template_gets_only_its_own_knobs(tmp_path):
    from baselines.registry import get_problem

    prob = get_problem("mla_prefill")
    template = prob.template()
    previous = re.sub(r'"TMA": (True|False), ', "", template)  # a template without the TMA knob
    assert previous != template
    mods = bench.load_variants(bench.VARIANTS[:2], template, previous, tmp_path)
    assert mods[0][1] == {k: v for k, v in bench.PREVIOUS.items() if k != "TMA"}
    assert "TMA" not in mods[0][2].KNOBS and mods[1][2].KNOBS == prob.default_knobs()
