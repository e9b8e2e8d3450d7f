"""`marathon worker`, and what the CLI learns from the workers polling a task queue."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from pydantic import ValidationError

from workflows.contracts import AGENT_QUEUE, GPU_QUEUE, RunSpec, explain
from cli.errors import UsageError


#: seconds a stopping worker's running activities may go on (MARATHON_SHUTDOWN_GRACE_S): below the
#: deployments' own stop grace (120 s), after which the process is killed
SHUTDOWN_GRACE_S = 90.0


def shutdown_grace_s(environ) -> float:
    """MARATHON_SHUTDOWN_GRACE_S, or UsageError naming it: a number of seconds >= 0."""
    raw = environ.get("MARATHON_SHUTDOWN_GRACE_S", "").strip()
    if not raw:
        return SHUTDOWN_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (0.0 <= value < float("inf")):
        raise UsageError(f"MARATHON_SHUTDOWN_GRACE_S must be a number of seconds >= 0, got {raw!r}")
    return value


def checked_queue(queue: str, source: str) -> str:
    """`queue` if it is a task queue name (the same rule as a run's gpu_queue), else UsageError naming `source`."""
    try:
        RunSpec(problem="softmax", gpu_queue=queue)
    except ValidationError as e:
        raise UsageError(f"invalid {source}: {explain(e)}")
    return queue


def worker_queue(flag: str | None, environ) -> str:
    """The GPU worker's task queue: --gpu-queue, else MARATHON_GPU_QUEUE (empty: unset), else marathon-gpu.
    A flag given empty is refused, not read as unset: `--gpu-queue "$POOL"` with POOL unset would otherwise
    put the worker on the shared queue, evaluating runs meant for another pool's GPUs."""
    if flag is not None:
        return checked_queue(flag, "--gpu-queue")
    env = environ.get("MARATHON_GPU_QUEUE", "")
    return checked_queue(env, "MARATHON_GPU_QUEUE") if env else GPU_QUEUE


def warn_llm_settings(env) -> None:
    """An agent worker starts whatever its llm settings say (a search run needs none), but says at once
    what is wrong with them: else the first llm-policy run learns it at its first turn, paused."""
    from activities.llm.endpoint import LlmSettings

    error = LlmSettings.from_env(env).error
    if error:
        print(f"marathon: warning: {error}; runs of the llm policy pause at their first turn until it is fixed "
              "and this worker restarted (search runs are unaffected)", file=sys.stderr, flush=True)


async def cmd_worker(args) -> int:
    from workflows.metrics import MetricsConfigError, setup_metrics
    from workflows.client import Unreachable, connect

    if args.role == "agent" and args.gpu_queue is not None:  # a run names its GPU queue; an agent serves every run
        raise UsageError("--gpu-queue is a GPU worker's (--role gpu or all); an agent worker serves every run, "
                         "whatever GPU queue the run names")
    queue = worker_queue(args.gpu_queue, os.environ)
    grace = shutdown_grace_s(os.environ)
    if args.role in ("agent", "all"):
        warn_llm_settings(os.environ)
    gpu_settings = None
    if args.role in ("gpu", "all"):
        from gpu_worker.settings import GpuWorkerSettings, SettingsError

        try:  # the GPU worker's settings, read once, here: a bad one stops the start before anything else
            gpu_settings = GpuWorkerSettings.from_env(os.environ)
        except SettingsError as e:
            raise UsageError(str(e))

    try:
        # before connecting: it makes the metrics-enabled runtime Temporal's default
        metrics = setup_metrics(args.metrics_port, role=args.role)
    except MetricsConfigError as e:
        raise UsageError(str(e))
    try:
        client = await connect(args.address, args.namespace)
    except Unreachable as e:
        raise UsageError(str(e))
    await check_namespace(client)
    from workflows.logs import configure_logging

    configure_logging()
    workers = []
    if args.role in ("agent", "all"):
        from activities.worker import build_agent_worker

        workers.append(build_agent_worker(client, shutdown_grace_s=grace))
    if args.role in ("gpu", "all"):
        from gpu_worker.worker import build_gpu_workers

        from gpu_worker.activities import evaluator
        from workflows.client import connect_config

        interpreter = evaluator(gpu_settings).interpreter
        # the identity says how this worker runs kernels: `marathon start` reads it from the queue's pollers
        gpu_client = await type(client).connect(**{**connect_config(args.address, args.namespace),
                                                   "identity": gpu_worker_identity(interpreter)},
                                                data_converter=client.data_converter)
        workers += build_gpu_workers(gpu_client, task_queue=queue, shutdown_grace_s=grace)
    # handled before "polling" is announced: a signal sent on reading it stops the worker cleanly
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    print(f"worker ({args.role}) polling {', '.join(w.task_queue for w in workers)} at "
          f"{client.service_client.config.target_host}", flush=True)
    print(metrics.describe(), flush=True)
    tasks = [asyncio.create_task(w.run()) for w in workers]
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait(tasks + [waiter], return_when=asyncio.FIRST_COMPLETED)
    if waiter in done:
        print(f"stopping: no new work taken; running activities may take up to {grace:g} s to finish "
              f"(MARATHON_SHUTDOWN_GRACE_S), then are cancelled and retried elsewhere", flush=True)
    await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
    if args.role in ("gpu", "all"):
        await asyncio.to_thread(close_gpu_harness)
    metrics.close()
    for t in done:
        if t is not waiter and t.exception():
            raise t.exception()
    if args.role in ("gpu", "all"):
        from gpu_worker.activities import evaluator

        ev = evaluator()
        if ev.settings.gpu_selftest and ev.selftest_verdict.failed:
            return 1  # the start-up self-test's failure stopped the workers; its line is in the log
    return 0


def close_gpu_harness() -> None:
    """Close the GPU worker's children once its workers have stopped: each removes its scratch directory
    (verification outputs among it) from MARATHON_GPU_WORKDIR, which outlives the worker, and a reference
    child first writes the cache entries it queued, so a restarted worker finds them."""
    from gpu_worker.activities import evaluator

    evaluator().close()


async def check_namespace(client) -> None:
    """One line where the namespace is not on the server: the SDK's worker would otherwise fail its validation
    with a traceback that ends in the server's raw status."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.service import RPCError, RPCStatusCode

    try:
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=client.namespace))
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise UsageError(f"namespace {client.namespace!r} is not on the server at "
                             f"{client.service_client.config.target_host}: {e.message}")
        # anything else (a key that may not describe namespaces): the worker's own validation decides


#: in a GPU worker's identity when it has no CUDA and runs kernels under the Triton interpreter
CPU_WORKER_TAG = "marathon-gpu-worker cpu-interpreter"


def gpu_worker_identity(interpreter: bool) -> str:
    import socket

    return f"{os.getpid()}@{socket.gethostname()} " + (CPU_WORKER_TAG if interpreter else "marathon-gpu-worker cuda")


#: a live worker's long polls reach the server at least once a minute, and the server goes on listing a
#: poller for minutes after its worker stops: a poller not heard from for this long is taken for gone
POLLER_FRESH_S = 120


async def queue_pollers(client, queue: str, workflow: bool = False) -> list[str] | None:
    """The identities of the workers polling the task queue (its workflow tasks, else its activity tasks)
    within POLLER_FRESH_S; None where the server does not say."""
    import time

    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.service import RPCError

    kind = TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW if workflow else TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
    try:
        resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind))
    except RPCError:
        return None
    now = time.time()
    return [p.identity for p in resp.pollers
            if not p.last_access_time.seconds or now - p.last_access_time.seconds < POLLER_FRESH_S]


async def agent_worker_missing(client) -> str | None:
    """One line saying that no worker polls the agent task queue, so nothing answers a run's queries or
    moves it on; None where one does, or where the server does not say."""
    if await queue_pollers(client, AGENT_QUEUE, workflow=True) == []:
        return (f"no worker is polling task queue {AGENT_QUEUE}: start one with `marathon worker --role all` "
                f"against this server (`--role agent` where GPU workers run elsewhere)")
    return None


async def unserved_queues(client, spec: RunSpec) -> list[str]:
    """One line for each task queue of the run that no worker polls (the agent queue's workflow tasks, the run's
    GPU queue's activities): a run started there waits until one starts."""
    lines = []
    if await queue_pollers(client, AGENT_QUEUE, workflow=True) == []:
        lines.append(f"no worker is polling task queue {AGENT_QUEUE}: nothing runs this run until one starts "
                     f"(`marathon worker --role all`, or `--role agent` where GPU workers run elsewhere)")
    gpu = await gpu_worker_missing(client, spec.gpu_queue)
    if gpu:
        lines.append(gpu)
    return lines


async def gpu_worker_missing(client, queue: str) -> str | None:
    """One line saying that no GPU worker polls the run's GPU task queue, so its candidates wait (an agent-only
    worker runs the loop and evaluates nothing); None where one does, or where the server does not say."""
    if await queue_pollers(client, queue) != []:
        return None
    return (f"no GPU worker is polling task queue {queue}: its candidates wait until one starts "
            f"(`marathon worker --role gpu" + ("" if queue == GPU_QUEUE else f" --gpu-queue {queue}") + "`)")


async def shared_agent_queue(client) -> str | None:
    """One line where workers already poll the agent task queue's activities: a model turn one of them takes
    goes to that worker's endpoint, not the one the demo serves. None where none does."""
    others = await queue_pollers(client, AGENT_QUEUE)
    if not others:
        return None
    return (f"other workers poll task queue {AGENT_QUEUE} ({', '.join(sorted(others))}): a model turn one of them "
            f"takes goes to its own endpoint, not the local model (the run pauses where it has none); stop them "
            f"for this demo, or `marathon resume` the run once they have stopped")


#: a live worker takes a run's first workflow task within moments of its start
FIRST_TASK_WAIT_S = 5.0


async def first_task_taken(client, wid: str, within: float = FIRST_TASK_WAIT_S) -> bool:
    """Whether a worker took the run's first workflow task within `within` seconds. The server lists a
    stopped worker's poller for minutes, so a listed poller does not say that anything will run the run."""
    from temporalio.api.enums.v1 import EventType

    h = client.get_workflow_handle(wid)
    deadline = asyncio.get_running_loop().time() + within
    while True:
        async for e in h.fetch_history_events():
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                return True
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.25)


async def wait_for_worker(client, proc, log, spec: RunSpec, timeout: float = 120) -> None:
    """Until the worker process `proc` (its output in `log`) polls the run's task queues, or one line saying
    why it does not."""
    deadline = asyncio.get_running_loop().time() + timeout
    while missing := await unserved_queues(client, spec):
        if proc.poll() is not None:
            raise UsageError(f"the worker exited with status {proc.returncode}; see {log}")
        if asyncio.get_running_loop().time() > deadline:
            raise UsageError(f"the worker did not poll within {timeout:g} s ({missing[0]}); see {log}")
        await asyncio.sleep(0.5)


async def check_workers_can_run(client, spec: RunSpec, label: str | None = None) -> None:
    """A problem file without get_cpu_inputs() cannot run where the run's GPU queue is served only by workers
    without CUDA (they run the interpreter on the CPU inputs): refused before the run starts."""
    from baselines.external.file import CPU_SHAPE, is_file_key

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
