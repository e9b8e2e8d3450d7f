from __future__ import annotations

import contextlib
import uuid
from concurrent.futures import ThreadPoolExecutor

from temporalio.worker import Worker

from activities.artifacts import ArtifactStore
from activities.ledger import read_ledger
from activities.worker import build_agent_worker
from tests.evaluators import SYNTHETIC_GPU_ACTIVITIES
from workflows.contracts import GPU_QUEUE, RunResult


@contextlib.asynccontextmanager
async def workers(client, gpu_activities=None):
    """The real agent worker plus a GPU worker (synthetic unless real activities are given)."""
    agent = build_agent_worker(client)
    gpu = Worker(client, task_queue=GPU_QUEUE, activities=gpu_activities or SYNTHETIC_GPU_ACTIVITIES,
                 activity_executor=ThreadPoolExecutor(4), max_concurrent_activities=4)
    async with agent, gpu:
        yield


def run_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def assert_contiguous(store: ArtifactStore, result: RunResult, n: int) -> None:
    recs = read_ledger(store, result.ledger_key)
    assert [r.iteration for r in recs] == list(range(1, n + 1)), [r.iteration for r in recs]
    assert result.iterations == n
