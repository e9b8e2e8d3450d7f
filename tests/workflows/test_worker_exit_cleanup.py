"""A GPU worker stopped with SIGTERM leaves nothing of its children in MARATHON_GPU_WORKDIR, a directory that
outlives it (systemd's CacheDirectory, a pod's emptyDir across container restarts); what a killed one left
is removed by the next worker to start there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

CHILD_DIRS = ("candidate-", "reference-")


def children_dirs(work, pid: int | None = None) -> list[str]:
    """The children's scratch directories in `work`; with `pid`, those of that worker process's children."""
    if not work.exists():
        return []
    return sorted(p.name for p in work.iterdir() if p.name.startswith(CHILD_DIRS)
                  and (pid is None or p.name.split("-")[1].split(".")[0] == str(pid)))


def _worker_with_children(address: str, tmp_path, work, name: str):
    """A GPU worker process on `work`, once it polls and its warm spare child has made its scratch: (the
    process, its log's path)."""
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "worker", "--role", "gpu", "--address", address, "--gpu-queue",
             "exit-cleanup"],
            env={**os.environ, "MARATHON_GPU_WORKDIR": str(work), "MARATHON_HOME": str(tmp_path / "home"),
                 "MARATHON_SHUTDOWN_GRACE_S": "1"},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not ("polling" in log_path.read_text() and children_dirs(work, proc.pid)):
        if time.monotonic() > deadline or proc.poll() is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(log_path.read_text()[-3000:])
        time.sleep(0.2)
    return proc, log_path


async def test_a_stopped_gpu_worker_removes_its_childrens_scratch(env, tmp_path):
    address = env.client.service_client.config.target_host
    work = tmp_path / "work"
    proc, log_path = _worker_with_children(address, tmp_path, work, "worker")
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert children_dirs(work) == [], "the children's scratch was left behind"


async def test_a_killed_gpu_worker_s_scratch_is_removed_by_the_next_one_to_start(env, tmp_path):
    address = env.client.service_client.config.target_host
    work = tmp_path / "work"
    killed, _ = _worker_with_children(address, tmp_path, work, "killed")
    left = children_dirs(work, killed.pid)
    os.killpg(killed.pid, signal.SIGKILL)  # the worker and its children: nothing removes their scratch
    killed.wait(30)
    assert children_dirs(work, killed.pid) == left
    proc, log_path = _worker_with_children(address, tmp_path, work, "next")
    try:
        assert children_dirs(work, killed.pid) == [], log_path.read_text()[-3000:]
        assert f"removed the scratch of {len(left)} children of workers no longer running" in log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
