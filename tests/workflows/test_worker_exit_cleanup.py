"""A GPU worker stopped with SIGTERM leaves nothing of its children in MARATHON_GPU_WORKDIR, a directory that
outlives it (systemd's CacheDirectory, a pod's emptyDir across container restarts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

CHILD_DIRS = ("candidate-", "reference-")


def children_dirs(work) -> list[str]:
    return sorted(p.name for p in work.iterdir() if p.name.startswith(CHILD_DIRS)) if work.exists() else []


async def test_a_stopped_gpu_worker_removes_its_childrens_scratch(env, tmp_path):
    address = env.client.service_client.config.target_host
    work, log_path = tmp_path / "work", tmp_path / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "worker", "--role", "gpu", "--address", address, "--gpu-queue",
             "exit-cleanup"],
            env={**os.environ, "MARATHON_GPU_WORKDIR": str(work), "MARATHON_HOME": str(tmp_path / "home"),
                 "MARATHON_SHUTDOWN_GRACE_S": "1"},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        # the warm spare child is made as the worker starts, with its scratch directory
        while not ("polling" in log_path.read_text() and children_dirs(work)):
            assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert children_dirs(work) == [], "the children's scratch was left behind"
