"""What a running stack reports, sampled while scripts/gpu_session.py runs: each GPU worker's device-owner
counters (its Prometheus metrics), nvidia-smi's utilization, memory and clock per GPU, and the host's CPU use."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request


def scrape_busy(port: int, name: str = "busy") -> float | None:
    """A GPU worker's marathon_gpu_<name>_seconds_total (busy: a device turn held, a job or a timing block;
    timed: timing blocks; closed: a timing block waiting or running, so new untimed jobs wait: the device
    owner's turns, gpu_worker.device.owner)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except Exception:  # noqa: BLE001
        return None
    m = re.search(rf"^marathon_gpu_{name}_seconds_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


SMI: list = []  # (time, gpu index, utilization %, memory used MiB, SM clock MHz), per GPU per second
CPU: list = []  # (time, busy share of all the host's cores since the previous row, 1-minute load average)


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all cores from /proc/stat (idle and iowait are not busy)."""
    try:
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4], sum(v)
    except (OSError, ValueError, IndexError):
        return None


def sample_cpu() -> None:
    """One row of the host's CPU use: whether the cores, not the GPU, are what the pipeline waits for."""
    now = _cpu_times()
    if now is None:
        return
    prev = getattr(sample_cpu, "prev", None)
    sample_cpu.prev = now
    if prev and now[1] > prev[1]:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = -1.0
        CPU.append((time.time(), round((now[0] - prev[0]) / (now[1] - prev[1]), 3), load))


def sample_smi(stop) -> None:
    """nvidia-smi's utilization (the share of each sample period in which a kernel ran) every second: the
    GPU's own busy figure, next to the harness's turn-held fraction; and the host's CPU use."""
    while not stop.is_set():
        sample_cpu()
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,clocks.sm",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
            t = time.time()
            for line in out.strip().splitlines():
                i, u, m, c = (x.strip() for x in line.split(","))
                SMI.append((t, int(i), float(u), float(m), float(c)))
        except Exception:  # noqa: BLE001 - no nvidia-smi (a CPU rehearsal): no samples
            return
        stop.wait(1.0)
