"""scripts/offline_compile_mla_prefill.py --template: another design's kernel compiled for sm_90 without a GPU
(in a process of its own: the interpreter must be off there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "scripts/offline_compile_mla_prefill.py"


def _run(args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


def test_knobs_file_needs_a_template(tmp_path):
    knobs = tmp_path / "k.jsonl"
    knobs.write_text("{}\n")
    p = _run(["--knobs-file", str(knobs)], timeout=60)
    assert p.returncode == 2 and "--knobs-file goes with --template" in p.stderr


@pytest.mark.slow  # one Triton compile and ptxas: ~10 s of CPU
def test_template_setting_compiles_for_sm90(tmp_path):
    knobs = tmp_path / "k.jsonl"
    knobs.write_text('{"num_stages": 2}\n')
    out = tmp_path / "rows.json"
    p = _run(["--template", "baselines/mla_prefill/split_scores_kernel.py", "--knobs-file", str(knobs),
              "--out", str(out)])
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert "error" not in row, row
    assert row["setting"] == {"num_stages": 2} and row["knobs"]["num_stages"] == 2
    assert row["knobs"]["BLOCK_N"] == 64  # the template's default for what the line leaves out
    assert 0 < row["regs"] <= 255 and 0 < row["smem"] <= 232448 and row["wgmma"] and row["cp_async"], row
