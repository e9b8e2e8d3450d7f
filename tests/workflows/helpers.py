from __future__ import annotations

import asyncio
import contextlib
import uuid
from concurrent.futures import ThreadPoolExecutor

from temporalio.worker import Worker

from workflows.artifacts import ArtifactStore
from activities.ledger import read_ledger
from activities.worker import build_agent_worker
from tests.evaluators import SYNTHETIC_GPU_ACTIVITIES
from workflows.contracts import AGENT_QUEUE, GPU_QUEUE, RunResult, RunSpec
from workflows.optimization import KernelOptimization


@contextlib.asynccontextmanager
async def workers(client, gpu_activities=None, gpu_queue: str = GPU_QUEUE):
    """The real agent worker plus a GPU worker (synthetic unless real activities are given). The synthetic
    one also polls a queue of its own, which its compile reports name, as a real GPU worker does."""
    from tests import evaluators

    agent = build_agent_worker(client)
    acts = gpu_activities or SYNTHETIC_GPU_ACTIVITIES
    gpu = Worker(client, task_queue=gpu_queue, activities=acts, activity_executor=ThreadPoolExecutor(4),
                 max_concurrent_activities=4)
    own = f"{gpu_queue}-test-{uuid.uuid4().hex[:8]}"
    mine = Worker(client, task_queue=own, activities=acts, activity_executor=ThreadPoolExecutor(4),
                  max_concurrent_activities=4)
    evaluators.WORKER_QUEUE = own
    try:
        async with agent, gpu, mine:
            yield
    finally:
        evaluators.WORKER_QUEUE = None


def run_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def assert_contiguous(store: ArtifactStore, result: RunResult, n: int) -> None:
    recs = read_ledger(store, result.ledger_key)
    assert [r.iteration for r in recs] == list(range(1, n + 1)), [r.iteration for r in recs]
    assert result.iterations == n


async def start(client, spec: RunSpec, prefix: str):
    return await client.start_workflow(KernelOptimization.run, spec, id=run_id(prefix), task_queue=AGENT_QUEUE)


async def until(pred, handle, timeout=60.0):
    """Poll the `status` query until `pred(status)` holds; returns that status."""
    async def poll():
        while True:
            st = await handle.query(KernelOptimization.status)
            if pred(st):
                return st
            await asyncio.sleep(0.1)
    return await asyncio.wait_for(poll(), timeout)
