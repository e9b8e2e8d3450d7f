"""The children's scratch directories (gpu_worker.scratch): named for their worker process, so a worker
starting in a shared GPU work directory removes those of killed workers and no live worker's."""

from __future__ import annotations

import os
import subprocess
import sys

from gpu_worker import scratch


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_killed_workers_scratch_is_removed_and_a_live_ones_kept(tmp_path):
    dead = _dead_pid()
    mine = scratch.make("candidate", tmp_path)
    assert os.path.basename(mine).startswith(f"candidate-{os.getpid()}.")  # the pid, then its start time
    (tmp_path / f"candidate-{os.getpid()}.1-reused").mkdir()  # this pid, another process's start: gone
    (tmp_path / f"reference-{dead}-x1").mkdir()
    (tmp_path / f"candidate-{dead}-y2").mkdir()
    (tmp_path / f"candidate-{dead}-y2" / "out.pt").write_bytes(b"0" * 10)
    (tmp_path / f"candidate-{os.getppid()}-z3").mkdir()  # a live process: a neighbour worker's child
    (tmp_path / "candidate-0099cw7h").mkdir()  # named by no worker: left
    (tmp_path / "cache").mkdir()
    (tmp_path / "input-bank").mkdir()
    gone = scratch.remove_orphans(tmp_path)
    assert sorted(gone) == sorted([f"candidate-{dead}-y2", f"candidate-{os.getpid()}.1-reused", f"reference-{dead}-x1"])
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([os.path.basename(mine), f"candidate-{os.getppid()}-z3", "candidate-0099cw7h", "cache",
                           "input-bank"])
    assert scratch.remove_orphans(tmp_path / "absent") == []
