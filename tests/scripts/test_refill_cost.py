"""scripts/refill_cost.py without a GPU: a timed repetition's refill counted at the CPU shapes. Mixing an
fp32 input costs 4 device ops (a normal draw, two in-place ops on it, the copy into the static buffer) and
32 bytes per element, 8 x the input's bytes; a file's default relative noise 6 ops and 48 bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_refill_is_counted_per_problem_and_distribution():
    p = subprocess.run([sys.executable, "scripts/refill_cost.py", "softmax", "mla_decode",
                        "tests/baselines/files/layernorm.py", "--json", "--reps", "2"], capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert [(r["problem"][:5], r["dist"]) for r in rows] == [
        ("softm", "normal"), ("softm", "wide"), ("mla_d", "unit"), ("mla_d", "small"), ("mla_d", "peaked"),
        ("file:", "plain"), ("file:", "scaled")]
    for r in rows:
        assert r["device"] == "cpu" and r["ms"] > 0
        tensors = {"softm": 1, "mla_d": 2, "file:": 3}[r["problem"][:5]]  # x; q and the cache; x, weight, bias
        per = (6, 12) if r["problem"].startswith("file:") else (4, 8)  # (ops per tensor, bytes / input bytes)
        assert r["ops"] == per[0] * tensors and r["bytes"] == per[1] * r["input_bytes"], r


def test_the_window_share_needs_a_gpu_and_a_built_in_problem():
    for argv, said in ((["kda", "--window"], "--window needs a GPU"),
                       (["tests/baselines/files/layernorm.py", "--window"], "--window times built-in problems")):
        p = subprocess.run([sys.executable, "scripts/refill_cost.py", *argv], capture_output=True, text=True,
                           timeout=120, cwd=REPO)
        assert p.returncode == 2 and said in p.stderr, p.stderr[-1000:]
