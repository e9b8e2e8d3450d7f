"""Harness soak (not a test): a softmax search through the real harness under the Triton interpreter for an
hour, faults injected, sampling what a long run could leak.

    python -m tests.soak_harness [--minutes 60] [--population 2] [--spares 2] [--out FILE]

A dev server on a SQLite file; one worker process (the agent worker and the real GPU worker with its spares,
tests/worker_proc.py --real). Injected: a candidate's sandbox child SIGKILLed every `--kill-child-every`
minutes, the worker process SIGKILLed (its children left to notice) and restarted at 40% of the time, the dev
server stopped for 5 s and restarted at 70%. Sampled every 20 s: sandbox child processes on the host (those
started by `python -m gpu_worker.child` and those forked by a fork server, whose command line is the
server's: known by their working directory, `ROLE-*` in the GPU work directory), the fork servers, open
files (the worker's, its children's and the servers'), the worker's resident memory, the temp disk (the GPU
work directory and the worker's temp directory), the run's iteration. Growth compares the medians of two
windows, 15-38% of the time (after warm-up, before the worker's restart) and 85-100% (after both restarts)."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from tests.soak import rss_mb, start_server
from tests.workflows.test_faults import _worker
from cli.server import connect_when_healthy
from workflows.contracts import AGENT_QUEUE, RunResult, RunSpec, StopRequest
from workflows.optimization import KernelOptimization

CHILD, FORKSERVER = "gpu_worker.child", "gpu_worker.forkserver"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd").removesuffix(" (deleted)")
    except OSError:
        return ""


def sandbox_processes(gpu_dir: Path) -> tuple[dict[int, str], list[int]]:
    """Every sandbox child on the host (orphans included), by pid: its role; and the fork servers' pids.
    A forked child keeps its server's command line; its working directory is its own `ROLE-*` folder in
    `gpu_dir`, the server's the repository."""
    children, servers, home = {}, [], gpu_dir.resolve()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        pid, argv = int(d.name), _cmdline(int(d.name))
        if CHILD in argv:
            children[pid] = argv[-2] if argv[-1] == "" else argv[-1]
        elif FORKSERVER in argv:
            folder = Path(_cwd(pid))
            if folder.parent == home:
                children[pid] = folder.name.split("-", 1)[0]
            else:
                servers.append(pid)
    return children, servers


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def disk_mb(*roots: Path) -> float:
    total = 0
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for f in files:
                try:
                    total += os.lstat(os.path.join(dirpath, f)).st_size
                except OSError:
                    pass
    return total / 2**20


async def iteration(client, wid: str) -> int | None:
    try:
        return (await client.get_workflow_handle(wid).query(KernelOptimization.status)).iteration
    except Exception:  # noqa: BLE001 - the server restarting
        return None


async def main(a) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="soak-harness-"))
    gpu_dir, worker_tmp = tmp / "gpu-work", tmp / "worker-tmp"
    worker_tmp.mkdir()
    env = {"MARATHON_GPU_WORKDIR": str(gpu_dir), "TMPDIR": str(worker_tmp), "MARATHON_SPARES": str(a.spares),
           "MARATHON_GPU_SELFTEST": "0"}  # the worker's alone: the dev server keeps its own temp directory
    server, address = start_server(tmp)
    log = open(tmp / "worker.log", "ab")
    worker = _worker(address, True, 0.0, log, env)
    client = await connect_when_healthy(address)
    wid = "soak-harness"
    await client.start_workflow(KernelOptimization.run, RunSpec(problem="softmax", budget={"iterations": 100000},
                                                                population=a.population, heartbeat_seconds=5),
                                id=wid, task_queue=AGENT_QUEUE)
    t0, total = time.time(), a.minutes * 60
    events, samples = [], []
    restarted = server_restarted = False
    next_kill = a.kill_child_every * 60
    while (now := time.time() - t0) < total:
        if not restarted and now >= 0.4 * total:
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait()
            events.append(f"{now / 60:.1f} min: the worker process SIGKILLed and restarted")
            worker, restarted = _worker(address, True, 0.0, log, env), True
        elif restarted and not server_restarted and now >= 0.7 * total:
            server.stop()
            await asyncio.sleep(5)
            server.start()
            client = await connect_when_healthy(address)
            events.append(f"{now / 60:.1f} min: the dev server stopped for 5 s and restarted on its SQLite file")
            server_restarted = True
        elif now >= next_kill:
            cands = [p for p, role in sandbox_processes(gpu_dir)[0].items() if role == "candidate"]
            if cands:
                os.kill(random.choice(cands), signal.SIGKILL)
                events.append(f"{now / 60:.1f} min: a candidate's sandbox child SIGKILLed")
            next_kill += a.kill_child_every * 60
        kids, servers = sandbox_processes(gpu_dir)
        samples.append({"t": now, "iteration": await iteration(client, wid), "children": len(kids),
                        "servers": len(servers),
                        "files": sum(open_files(p) for p in [worker.pid, *kids, *servers]),
                        "worker_mb": rss_mb(worker.pid), "children_mb": sum(rss_mb(p) for p in kids),
                        "servers_mb": sum(rss_mb(p) for p in servers), "disk_mb": disk_mb(gpu_dir, worker_tmp)})
        print(samples[-1], flush=True)
        await asyncio.sleep(a.sample_s)
    await client.get_workflow_handle(wid).signal(KernelOptimization.stop, StopRequest(reason="soak done"))
    res = await client.get_workflow_handle(wid, result_type=RunResult).result()
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    await asyncio.sleep(5)
    left_children, left_servers = sandbox_processes(gpu_dir)
    left = [*left_children, *left_servers]
    server.stop()

    def window(lo, hi, key):
        vals = [s[key] for s in samples if lo * total <= s["t"] <= hi * total and s[key] is not None]
        return statistics.median(vals) if vals else float("nan")

    slack = {"children": 1, "servers": 0, "files": 20, "worker_mb": 30, "children_mb": 300, "servers_mb": 50,
             "disk_mb": 100}
    names = {"children": "sandbox child processes", "servers": "fork servers",
             "files": "open files (worker, children, servers)", "worker_mb": "worker resident memory (MB)",
             "children_mb": "children's resident memory (MB)", "servers_mb": "fork servers' resident memory (MB)",
             "disk_mb": "temp disk (MB)"}
    rows, grew = [], []
    for k, name in names.items():
        early, late = window(0.15, 0.38, k), window(0.85, 1.0, k)
        g = late > 1.2 * early + slack[k]
        grew += [name] if g else []
        rows.append(f"| {name} | {early:.0f} | {late:.0f} | {max(s[k] for s in samples):.0f} | {'**yes**' if g else 'no'} |")
    its = [s["iteration"] for s in samples if s["iteration"] is not None]
    text = f"""# Harness soak: {a.minutes:g} minutes, faults injected

Command: `python -m tests.soak_harness --minutes {a.minutes:g} --population {a.population} --spares {a.spares} \\
  --kill-child-every {a.kill_child_every:g}`;
{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.

Injected: {'; '.join(events)}.

Run: {res.iterations} iterations recorded (the last sample {max(its) if its else '-'}), stopped by {res.stopped_by};
sandbox children and fork servers left 5 s after the worker's end: {len(left_children)} and
{len(left_servers)}.

| measure | 15-38% (median) | 85-100% (median) | max | grew |
|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 1 if grew or left else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--population", type=int, default=2)
    ap.add_argument("--spares", type=int, default=2)
    ap.add_argument("--kill-child-every", type=float, default=7.0, help="minutes between candidate-child kills")
    ap.add_argument("--sample-s", type=float, default=20.0)
    ap.add_argument("--out", default=None, help="also write the Markdown here")
    sys.exit(asyncio.run(main(ap.parse_args())))
