"""scripts/time_knobs.py without a GPU: settings checked under the interpreter on the CPU shape, against
the oracle with the harness's tolerance; an unknown knob is one row's error, the others still run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_settings_are_checked_and_a_bad_one_is_reported(tmp_path):
    out = tmp_path / "rows.jsonl"
    p = subprocess.run([sys.executable, "scripts/time_knobs.py", "softmax", "--knobs", '{"ROWS": 2}',
                        "--knobs", '{"NOPE": 1}', "--out", str(out)], capture_output=True, text=True, timeout=300,
                       cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert p.returncode == 1, p.stdout + p.stderr  # not every setting passed
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert {r["dist"] for r in rows} == {"normal", "wide"} and all(r["ok"] and r["knobs"] == {"ROWS": 2} for r in rows)
    assert all(r["err"] <= r["tol"] and "ms" not in r for r in rows)  # checked, not timed, under the interpreter
    assert "error: ValueError: unknown knobs ['NOPE']" in p.stdout


def test_another_template_is_rendered_with_its_own_knobs(tmp_path):
    """--template: a design beside the starting kernel (KDA's segmented scan), with a knob only it has, checked
    under the interpreter against the oracle on every distribution; the problem's own template lacks that knob."""
    out = tmp_path / "rows.jsonl"
    cmd = [sys.executable, "scripts/time_knobs.py", "kda", "--knobs", '{"SEGMENTS": 2}', "--out", str(out)]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run(cmd + ["--template", "baselines/kda/scan_kernel.py"], capture_output=True, text=True,
                       timeout=300, cwd=REPO, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert {r["dist"] for r in rows} == {"mild", "strong"} and all(r["ok"] and r["err"] < 1e-5 for r in rows)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert p.returncode == 1 and "unknown knobs ['SEGMENTS']" in p.stdout
