"""`marathon worker`, and what the CLI learns from the workers polling a task queue."""

from __future__ import annotations

import asyncio
import os
import signal

from pydantic import ValidationError

from workflows.contracts import RunSpec, explain
from activities.cli.errors import UsageError

async def cmd_worker(args) -> int:
    from workflows.metrics import MetricsConfigError, setup_metrics
    from workflows.client import Unreachable, connect
    from workflows.contracts import GPU_QUEUE

    queue = args.gpu_queue or os.environ.get("MARATHON_GPU_QUEUE") or GPU_QUEUE
    try:
        RunSpec(problem="softmax", gpu_queue=queue)  # the same rule as a run's gpu_queue
    except ValidationError as e:
        raise UsageError(f"invalid --gpu-queue: {explain(e)}")

    try:
        # before connecting: it makes the metrics-enabled runtime Temporal's default
        metrics = setup_metrics(args.metrics_port, role=args.role)
    except MetricsConfigError as e:
        raise UsageError(str(e))
    try:
        client = await connect(args.address, args.namespace)
    except Unreachable as e:
        raise UsageError(str(e))
    from workflows.logs import configure_logging

    configure_logging()
    workers = []
    if args.role in ("agent", "all"):
        from activities.worker import build_agent_worker

        workers.append(build_agent_worker(client))
    if args.role in ("gpu", "all"):
        from gpu_worker.worker import build_gpu_worker

        from gpu_worker.activities import evaluator
        from workflows.client import connect_config

        # the identity says how this worker runs kernels: `marathon start` reads it from the queue's pollers
        gpu_client = await type(client).connect(**{**connect_config(args.address, args.namespace),
                                                   "identity": gpu_worker_identity(evaluator().interpreter)},
                                                data_converter=client.data_converter)
        workers.append(build_gpu_worker(gpu_client, task_queue=queue))
    print(f"worker ({args.role}) polling {', '.join(w.task_queue for w in workers)} at "
          f"{client.service_client.config.target_host}", flush=True)
    print(metrics.describe(), flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    tasks = [asyncio.create_task(w.run()) for w in workers]
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait(tasks + [waiter], return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
    metrics.close()
    for t in done:
        if t is not waiter and t.exception():
            raise t.exception()
    return 0


#: in a GPU worker's identity when it has no CUDA and runs kernels under the Triton interpreter
CPU_WORKER_TAG = "marathon-gpu-worker cpu-interpreter"


def gpu_worker_identity(interpreter: bool) -> str:
    import socket

    return f"{os.getpid()}@{socket.gethostname()} " + (CPU_WORKER_TAG if interpreter else "marathon-gpu-worker cuda")


async def queue_pollers(client, queue: str) -> list[str]:
    """The identities of the workers that polled the activity task queue recently ([] where unknown)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.service import RPCError

    try:
        resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY))
    except RPCError:
        return []
    return [p.identity for p in resp.pollers]


async def check_workers_can_run(client, spec: RunSpec, label: str | None = None) -> None:
    """A problem file without get_cpu_inputs() cannot run where the run's GPU queue is served only by workers
    without CUDA (they run the interpreter on the CPU inputs): refused before the run starts."""
    from baselines.external import CPU_SHAPE, is_file_key

    if not is_file_key(spec.problem) or spec.shape not in (None, CPU_SHAPE):
        return
    from baselines.registry import get_problem

    problem = get_problem(spec.problem)
    if problem.has_cpu:
        return
    pollers = await queue_pollers(client, spec.gpu_queue)
    if pollers and all(CPU_WORKER_TAG in p for p in pollers):
        raise UsageError(f"{label or problem.label} defines no get_cpu_inputs(), and the workers on task queue "
                         f"{spec.gpu_queue} have no CUDA (they run the Triton interpreter on a problem's CPU "
                         f"inputs): add get_cpu_inputs() to the file (small inputs; get_cpu_init_inputs() too if "
                         f"Model's constructor arguments differ for them), or start GPU workers on {spec.gpu_queue}")
