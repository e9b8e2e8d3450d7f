"""scripts/device_time_check.py's row filter, on the CPU (the measurement itself needs CUDA)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_filter_that_matches_no_row_is_one_clear_error():
    p = subprocess.run([sys.executable, "scripts/device_time_check.py", "--scoreboard", "docs/scoreboard.json",
                        "--only", "no_such_problem"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith("no scoreboard row matches no_such_problem"), p.stderr
