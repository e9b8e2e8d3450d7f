"""A worker process for fault tests: the real agent worker plus the GPU side, either the synthetic
evaluator (fast) or the real harness. `python -m tests.worker_proc ADDRESS [--real] [--gpu-only]`; it is
meant to be SIGKILLed. MARATHON_TEST_DELAY_S makes synthetic compile/benchmark slow enough to be killed
mid-way. `--gpu-only`: no agent worker (several GPU worker processes beside one agent)."""

from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from temporalio.worker import Worker


async def main(address: str, real: bool, gpu_only: bool = False) -> None:
    from activities.worker import build_agent_worker
    from workflows.client import connect
    from workflows.contracts import GPU_QUEUE

    client = await connect(address)
    if gpu_only:
        from workflows.logs import configure_logging

        configure_logging()  # JSON lines: a test reads the stages' phases from them
    if real:
        from gpu_worker.worker import build_gpu_workers

        gpu = build_gpu_workers(client)
    else:
        from tests import evaluators

        evaluators.DELAY_S = float(os.environ.get("MARATHON_TEST_DELAY_S", "0"))
        gpu = [Worker(client, task_queue=GPU_QUEUE, activities=evaluators.SYNTHETIC_GPU_ACTIVITIES,
                      activity_executor=ThreadPoolExecutor(4), max_concurrent_activities=4)]
    print("worker ready", flush=True)
    agent = [] if gpu_only else [build_agent_worker(client)]
    await asyncio.gather(*(w.run() for w in agent + gpu))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], "--real" in sys.argv, "--gpu-only" in sys.argv))
