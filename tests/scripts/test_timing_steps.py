"""scripts/timing_steps.py's arguments, on the CPU (the steps themselves need CUDA)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args):
    return subprocess.run([sys.executable, "scripts/timing_steps.py", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_an_unknown_step_is_one_clear_error_before_any_device_is_needed():
    p = run("mla_decode", "--steps", "rotated,warm-everything")
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "--steps: unknown warm-everything" in last and "harness+code" in last, p.stderr


def test_known_steps_go_on_to_the_device_check():
    p = run("mla_decode", "--steps", "rotated,harness+code")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith("the timing steps need a CUDA device"), p.stderr


def test_the_code_kernel_runs_under_the_interpreter(load_script, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import torch

    x = torch.zeros(128)
    load_script("timing_steps")._code_kernel()[(1,)](x, STEPS=3)
    # x -> x * (1 + i 1e-7) + i 1e-5 for i = 0, 1, 2
    expect = ((0 * 1.0 + 0.0) * (1 + 1e-7) + 1e-5) * (1 + 2e-7) + 2e-5
    assert torch.allclose(x, torch.full((128,), expect)), x[:4]
