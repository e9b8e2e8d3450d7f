"""scripts/reference_timing.py, on the CPU: the reference role's timing code runs in a plain process under the
interpreter stand-in (its times say nothing about speed), and bad arguments are one clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args, env=None):
    return subprocess.run([sys.executable, "scripts/reference_timing.py", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=env)


def test_every_variant_is_timed_by_the_reference_roles_code():
    p = run("mla_decode", "--rounds", "1", "--blocks", "1", "--reps", "2", env={**os.environ, "TRITON_INTERPRET": "1"})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert "torch-bmm" in lines[0] and "reference role" in lines[0], p.stdout
    assert lines[-1].startswith("kernels per call"), p.stdout
    assert [ln.split()[2] for ln in lines[1:-1]] == ["plain", "fingerprint", "entries+fingerprint", "one",
                                                   "floor"], p.stdout


def test_sandboxed_the_same_requests_go_to_a_reference_child():
    p = run("mla_decode", "--rounds", "1", "--blocks", "1", "--reps", "2", "--sandboxed",
            env={**os.environ, "TRITON_INTERPRET": "1"})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert "torch-bmm" in lines[0] and "a sandboxed reference child" in lines[0], p.stdout
    assert len(lines) == 7 and all("median" in ln for ln in lines[1:-1]), p.stdout


def test_a_shape_out_of_range_is_one_clear_error():
    p = run("mla_decode", "--shape", "9")
    assert p.returncode == 2 and "has shapes 0..1" in p.stderr.strip().splitlines()[-1], p.stderr
