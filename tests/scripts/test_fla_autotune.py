"""scripts/fla_autotune.py's refusals: bad arguments, and a host without a GPU (capturing and checking FLA's
autotuning choices needs one), each one line and exit 2 (argparse's usage above it), leaving nothing in the temp directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fla_autotune.py"


def _err(args: list[str], cwd: Path) -> str:
    tmp = cwd / "tmp"
    tmp.mkdir()
    p = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TMPDIR": str(tmp)})
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert not list(tmp.iterdir()), list(tmp.iterdir())  # its empty Triton cache is not left behind
    return p.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("args, message", [
    (["check"], "check takes the document's path"),
    (["capture", "doc.json"], "check takes the document's path"),
    (["capture", "--against", "doc.json"], "--against is for check"),
    (["check", "missing.json"], "no such file: missing.json"),
    (["check", "doc.json", "--against", "missing.json"], "no such file: missing.json"),
])
def test_bad_arguments_are_one_line(args, message, tmp_path):
    (tmp_path / "doc.json").write_text("{}")
    assert message in _err(args, tmp_path)


def test_no_gpu_is_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    assert "needs a GPU" in _err(["capture"], tmp_path)
