"""scripts/copy_speed.py measures copies between host memory and a GPU: without one it says so and exits 2
(its measurement itself is the GPU test below)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_without_a_gpu_it_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    p = subprocess.run([sys.executable, "scripts/copy_speed.py", "softmax"], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert p.returncode == 2 and "no CUDA device" in p.stderr, p.stderr[-1000:]


@pytest.mark.gpu
def test_on_a_gpu_each_way_is_measured_and_checked():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    p = subprocess.run([sys.executable, "scripts/copy_speed.py", "softmax", "--reps", "2"], capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    for way in ("plain", "staged", "pinned"):
        assert f"  {way}" in p.stdout and "GB/s" in p.stdout, p.stdout
