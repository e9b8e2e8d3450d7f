"""`marathon verify` on a kernel that never returns: it says at once what it runs and how long a stage may
take, Ctrl-C ends it within seconds, and no sandbox child outlives it (CPU, the Triton interpreter)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOOP = "def run(inputs, out):\n    while True:\n        pass\n"


def _processes_under(path: Path) -> list[int]:
    """Processes whose working directory lies under `path` (a sandbox child's is its temp directory)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd.startswith(str(path)):
            found.append(int(pid))
    return found


@pytest.mark.slow(40)
def test_an_interrupted_verify_ends_with_its_sandbox_child(tmp_path):
    kernel = tmp_path / "loop.py"
    kernel.write_text(LOOP)
    work = tmp_path / "gpu"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARATHON_HOME": str(tmp_path / "home"),
           "MARATHON_GPU_WORKDIR": str(work), "TRITON_INTERPRET": "0"}
    p = subprocess.Popen([sys.executable, "-m", "cli", "verify", "softmax", str(kernel)], env=env, cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([p.stderr], [], [], 60)
        assert ready, "nothing said within 60 s"
        first = p.stderr.readline()
        assert first.startswith(f"verifying {kernel} against softmax here (CPU, Triton interpreter)"), first
        assert "Ctrl-C stops it now" in first
        deadline = time.monotonic() + 60
        while not _processes_under(work):  # the sandbox child has started on the kernel
            assert time.monotonic() < deadline, "no sandbox child started"
            time.sleep(0.2)
        time.sleep(3)  # inside the candidate's loop by now
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        assert p.wait(20) == 130
        assert time.monotonic() - t0 < 20
        deadline = time.monotonic() + 15
        while _processes_under(work):
            assert time.monotonic() < deadline, f"left running: {_processes_under(work)}"
            time.sleep(0.2)
    finally:
        if p.poll() is None:
            p.kill()
        for pid in _processes_under(work):
            os.kill(pid, signal.SIGKILL)
