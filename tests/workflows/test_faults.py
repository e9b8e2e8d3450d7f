"""Faults lose nothing: the worker SIGKILLed mid-activity and the dev server restarted on its SQLite
file, both mid-run, with the run started by the plain temporal CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from activities.ledger import read_ledger
from tests.conftest import temporal_path
from cli.server import connect_when_healthy, start_dev_server
from workflows.contracts import RunResult
from workflows.optimization import KernelOptimization


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DevServer:
    def __init__(self, db, port):
        self.db, self.port, self.proc = db, port, None

    def start(self):
        self.proc = start_dev_server(self.port, 0, self.db, headless=True)

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)


def _worker(address: str, real: bool, delay: float, log, env: dict | None = None) -> subprocess.Popen:
    """`env`: more environment for the worker process alone."""
    env = {**os.environ, **(env or {}), "MARATHON_TEST_DELAY_S": str(delay)}
    argv = [sys.executable, "-m", "tests.worker_proc", address] + (["--real"] if real else [])
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


async def _until(client, wid, pred, timeout=400):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            st = await client.get_workflow_handle(wid).query(KernelOptimization.status)
            if pred(st):
                return st
        except Exception:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"condition not reached within {timeout}s")


async def _scenario(tmp_path, store, real: bool, iterations: int, delay: float, compact_every: int = 5):
    port = _free_port()
    address = f"127.0.0.1:{port}"
    server = DevServer(tmp_path / "temporal.db", port)
    server.start()
    # a server that accepts connections may still answer "frontend is not healthy yet" for seconds
    client = await connect_when_healthy(address)
    log = open(tmp_path / "worker.log", "ab")
    worker = _worker(address, real, delay, log)
    wid = "fault-run"
    try:
        # started with the plain temporal CLI, as a user would
        spec = {"problem": "softmax", "budget": {"iterations": iterations}, "compact_every": compact_every,
                "heartbeat_seconds": 3}
        subprocess.run([temporal_path(), "workflow", "start", "--address", address, "--type",
                        "KernelOptimization", "--task-queue", "marathon-agent", "--workflow-id", wid,
                        "--input", json.dumps(spec)], check=True, capture_output=True)
        third = iterations // 3
        # 1. SIGKILL the worker while an activity is in flight
        await _until(client, wid, lambda s: s.iteration >= third and s.phase == "evaluating")
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        await asyncio.sleep(2)
        worker = _worker(address, real, delay, log)
        # 2. stop the dev server mid-run, leave the worker without a server, restart on the same file
        await _until(client, wid, lambda s: s.iteration >= 2 * third)
        server.stop()
        await asyncio.sleep(5)
        server.start()
        client = await connect_when_healthy(address)
        res = await asyncio.wait_for(client.get_workflow_handle(wid, result_type=RunResult).result(), 600)
        st = await client.get_workflow_handle(wid).query(KernelOptimization.status)
        assert worker.poll() is None, "the worker survived the server's absence"
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        server.stop()
    recs = read_ledger(store, res.ledger_key)
    assert [r.iteration for r in recs] == list(range(1, iterations + 1))
    assert res.iterations == iterations and st.iteration == iterations and st.used.iterations == iterations
    assert res.stopped_by == "budget-iterations"
    return res, recs


@pytest.mark.slow(45)
async def test_worker_kill_and_server_restart_lose_nothing(tmp_path, store):
    await _scenario(tmp_path, store, real=False, iterations=15, delay=0.5)


@pytest.mark.slow(150)
async def test_done_when_scenario_with_the_real_harness(tmp_path, store):
    """The same scenario through the real harness: 3 softmax iterations (a compaction at the end) under the
    Triton interpreter on CPU, worker SIGKILLed in the second and dev server restarted in the third."""
    res, recs = await _scenario(tmp_path, store, real=True, iterations=3, delay=0, compact_every=3)
    assert res.best is not None and res.best.interpreter
    assert any(r.outcome in ("passed", "improved") for r in recs)
