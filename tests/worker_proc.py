"""A worker process for fault tests: the real agent worker plus the GPU side, either the synthetic
evaluator (fast) or the real harness. `python -m tests.worker_proc ADDRESS [--real]`; it is meant to be
SIGKILLed. MARATHON_TEST_DELAY_S makes synthetic compile/benchmark slow enough to be killed mid-way."""

from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from temporalio.worker import Worker


async def main(address: str, real: bool) -> None:
    from activities.worker import build_agent_worker
    from workflows.client import connect
    from workflows.contracts import GPU_QUEUE

    client = await connect(address)
    if real:
        from gpu_worker.worker import build_gpu_worker

        gpu = build_gpu_worker(client)
    else:
        from tests import evaluators

        evaluators.DELAY_S = float(os.environ.get("MARATHON_TEST_DELAY_S", "0"))
        gpu = Worker(client, task_queue=GPU_QUEUE, activities=evaluators.SYNTHETIC_GPU_ACTIVITIES,
                     activity_executor=ThreadPoolExecutor(4), max_concurrent_activities=4)
    print("worker ready", flush=True)
    await asyncio.gather(build_agent_worker(client).run(), gpu.run())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], "--real" in sys.argv))
