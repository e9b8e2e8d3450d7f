"""scripts/offline_compile_kda_scan.py: programs per SM from registers and shared memory, and the launches
compiled for sm_90 without a GPU (in a process of its own: the interpreter must be off there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from offline_compile_kda_scan import per_sm  # noqa: E402


def test_programs_per_sm():
    assert per_sm(218, 4, 73728) == 2       # the starting kernel's state pass: 224 x 128 registers a program
    assert per_sm(132, 4, 53248) == 3       # by registers (3.9), not by shared memory (4)
    assert per_sm(64, 8, 163840) == 1       # by shared memory
    assert per_sm(255, 4, 0) == 2


@pytest.mark.slow  # ptxas on eleven launches: ~13 s of CPU, longer on a busy host
def test_every_launch_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "scripts/offline_compile_kda_scan.py"], capture_output=True, text=True,
                       timeout=300, cwd=REPO, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert {r["launch"] for r in rows} == {"start_state", "scan_state", "compose", "walk"}
    for r in rows:
        assert "error" not in r, r
        assert 0 < r["regs"] <= 255 and r["smem"] > 0 and r["programs_per_sm"] >= 1 and r["wgmma"], r
