"""One candidate, one GPU worker, with the real harness: two GPU worker processes (Triton interpreter,
sandboxed children) on one queue. Each candidate's verify and benchmark are started by the worker that
compiled it, from that worker's own queue, and its verification takes the child the compile left loaded:
no stage loads or compiles it a second time. Throughput is tests/workflows/test_one_worker.py's (stand-ins:
on this host's cores real interpreter workers are CPU-bound)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest
from temporalio.api.enums.v1 import EventType

from activities.worker import build_agent_worker
from tests.workflows.helpers import assert_contiguous, start
from workflows.contracts import GPU_QUEUE, RunSpec


def _gpu_worker(address: str, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.worker_proc", address, "--real", "--gpu-only"],
                            env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


async def _stages(client, child_id: str) -> list[tuple[str, str, str]]:
    """(activity, task queue, identity of the worker that started it) of an evaluation's GPU stages."""
    hist = await client.get_workflow_handle(child_id).fetch_history()
    scheduled, out = {}, []
    for e in hist.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            scheduled[e.event_id] = (a.activity_type.name, a.task_queue.name)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = e.activity_task_started_event_attributes
            out.append((*scheduled[a.scheduled_event_id], a.identity))
    return out


@pytest.mark.slow(60)  # two worker processes starting their sandboxes on this host: 1.5-2.5 minutes
async def test_two_real_gpu_workers_keep_each_candidate_on_the_worker_that_compiled_it(env, store, tmp_path):
    address = env.client.service_client.config.target_host
    logs = [open(tmp_path / f"gpu{i}.log", "wb") for i in range(2)]
    procs = [_gpu_worker(address, log) for log in logs]
    try:
        async with build_agent_worker(env.client):
            spec = RunSpec(problem="softmax", budget={"iterations": 3}, population=3)
            h = await start(env.client, spec, "two-real-gpus")
            res = await asyncio.wait_for(h.result(), 400)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert_contiguous(store, res, 3)
    children = [w.id async for w in env.client.list_workflows(f"WorkflowType = 'EvaluateCandidate' AND "
                                                              f"WorkflowId STARTS_WITH '{h.id}-eval-'")]
    assert len(children) == 3
    starters = set()
    for cid in children:
        stages = await _stages(env.client, cid)
        names = [s[0] for s in stages]
        assert names[0] == "compile_candidate" and stages[0][1] == GPU_QUEUE, stages
        worker = stages[0][2]
        starters.add(worker)
        for name, queue, who in stages[1:]:
            assert queue.startswith(GPU_QUEUE + "-") and who == worker, stages  # its worker's own queue
    # each worker's phase log: the compile stage loads and compiles a candidate, and the verification that
    # follows takes that child (handed on), compiling nothing
    lines = [json.loads(x) for p in tmp_path.glob("gpu*.log") for x in p.read_text().splitlines()
             if x.startswith("{") and '"phases"' in x]
    by_cand: dict[str, list[dict]] = {}
    for x in lines:
        by_cand.setdefault(x["candidate"], []).append(x)
    assert len(by_cand) == 3
    for cand, xs in by_cand.items():
        assert [x["event"] for x in xs].count("compile") == 1, xs
        first_verify = next(x for x in xs if x["event"] == "verify")
        assert first_verify["phases"].get("handed-on") == 1 and "compile" not in first_verify["phases"], xs
    print(f"{len(starters)} of 2 workers compiled candidates")
