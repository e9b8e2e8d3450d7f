"""Build the GPU worker: `build_gpu_workers(client)` returns its two temporalio Workers, one on the shared
queue (GPU_QUEUE or the pool's) and one on a queue only this process polls (`own_queue`): a compile report
names the latter, and the candidate's verify and benchmark come back there, to the child that holds it.

Concurrency: compile activities run on CPU cores ahead of the GPU; everything that touches the GPU
takes a turn from the evaluator's device owner (gpu_worker.device.owner): a timing block runs with
nothing else of the worker's on the device, untimed jobs (uploads, verification, comparisons) between them. On CUDA the worker accepts 8 concurrent activities on each of its two queues
(compiles overlap a timed job; MARATHON_GPU_CONCURRENCY); under the interpreter 2.

Settings: the evaluator's (gpu_worker.settings, parsed from the environment once, when it is built).

Self-test: with `selftest=True` (default on CUDA, or MARATHON_GPU_SELFTEST=1) the canaries run in the
background while the worker already serves; benchmarks and profiles run, and their reports wait for the
verdict, held by the evaluator (Evaluator.selftest_verdict; GpuActivities.selftest_awaited), compiles and
verifications do not. If they fail, the worker logs the canaries' problems, refuses all work (retryable, so
other workers take it) and shuts its Temporal workers down.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio.worker import Worker

from gpu_worker import scratch
from gpu_worker.activities import GpuActivities, evaluator
from gpu_worker.settings import work_root
from gpu_worker.wall import host_summary
from workflows.contracts import GPU_QUEUE


def gpu_activities(ev=None, own: str | None = None, selftest_awaited: bool = False) -> list:
    """The GPU worker's activities over `ev` (default: this process's evaluator)."""
    return GpuActivities(ev if ev is not None else evaluator(), own, selftest_awaited).all()


def warm_list(value: str, default_shape: str | None = None) -> list[tuple[str, str | None]]:
    """MARATHON_WARM_PROBLEM parsed: comma-separated `problem` or `problem:shape name` entries. Unknown
    problems raise here, at worker start, with the registry's message."""
    from baselines.registry import check_problem_name

    out = []
    for item in filter(None, (x.strip() for x in value.split(","))):
        name, _, shape = item.partition(":")
        check_problem_name(name.strip())
        out.append((name.strip(), shape.strip() or default_shape))
    return out


def other_listed_shapes(problem_name: str, primary: str) -> tuple[list[str], str | None]:
    """A warmed problem's listed shapes besides `primary`, cheapest first, and the one among them whose
    reference child stays up (a would-be best's second verification goes there: the first of them)."""
    from baselines.registry import get_problem
    from gpu_worker.harness.verify import other_shapes

    problem = get_problem(problem_name)
    others = other_shapes(problem, problem.shape_named(primary))
    return others, (others[0] if others else None)


def warm_in_background(ev, items: list[tuple[str, str | None]], all_shapes: bool = False) -> threading.Thread:
    """Warm the evaluator (Evaluator.warm, per problem and shape) in a thread while the worker already
    serves: warming takes minutes (KDA's oracle bank and FLA's first, autotuning call), and compiles can use
    the CPU cores meanwhile instead of waiting for the first poll. Verifications that come early wait for
    the reference child as warming holds it, as they would for their own first oracle. With `all_shapes`
    (MARATHON_WARM_ALL_SHAPES), a problem named without a shape then warms its other listed shapes lightly
    (Evaluator.warm_shapes). What a warm-up computes is kept in the caches, so a restarted worker's reads it.
    A failure is printed and leaves that problem cold: its first verification does the work instead."""
    def run():
        for name, shape in items:
            t0 = time.monotonic()
            try:
                r = ev.warm(name, shape)
                print(f"warm {name}: {r.get('oracles')} oracles in {time.monotonic() - t0:.1f} s; parts (s): "
                      f"{r.get('parts')}", flush=True)
                if all_shapes and shape is None:
                    others, keep = other_listed_shapes(name, r["shape"])
                    for w in ev.warm_shapes(name, others, keep):
                        print(f"warm {name} at {w['shape']}: {w['oracles']} cases ({w['parts']['cached']} cached) "
                              f"in {w['seconds']:.1f} s", flush=True)
            except Exception as e:  # noqa: BLE001 - a cold start is slower, not wrong
                print(f"warm {name} failed after {time.monotonic() - t0:.1f} s, left cold: "
                      f"{type(e).__name__}: {e}", flush=True)

    t = threading.Thread(target=run, name="gpu-warm", daemon=True)
    t.start()
    return t


def selftest_in_background(ev, on_failure) -> threading.Thread:
    """Run the canaries (Evaluator.selftest, which settles the evaluator's verdict) in a thread; a self-test
    that raises settles the verdict as failed here. On a failure, print one line naming the canaries'
    problems and call `on_failure`."""
    def run():
        t0 = time.monotonic()
        try:
            res = ev.selftest(reuse=True)  # a pass kept from an earlier start of this harness here serves
        except Exception as e:  # noqa: BLE001 - a self-test that cannot run has not passed
            res = {"ok": False, "problems": [f"the self-test raised {type(e).__name__}: {e}"]}
            ev.selftest_verdict.settle(res)
        if res.get("ok") and res.get("reused_from"):
            print("GPU worker self-test: the pass of " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
                res["reused_from"])) + " reused (same harness, settings, versions, GPU and host)", flush=True)
            return
        if res.get("ok"):
            print(f"GPU worker self-test passed in {time.monotonic() - t0:.1f} s", flush=True)
            return
        print("GPU worker self-test failed, refusing to serve: " + "; ".join(res.get("problems") or []), flush=True)
        on_failure()

    t = threading.Thread(target=run, name="gpu-selftest", daemon=True)
    t.start()
    return t


def own_queue(task_queue: str) -> str:
    """A queue name no other process polls, new at every start: a restarted worker has lost its loaded
    children, so the stages sent to its predecessor's queue must time out there and start again."""
    return f"{task_queue}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def build_gpu_workers(client, task_queue: str = GPU_QUEUE, selftest: bool | None = None,
                      max_concurrent: int | None = None, ev=None, shutdown_grace_s: float = 0.0) -> list[Worker]:
    """Its two Workers over `ev` (default: this process's evaluator); `shutdown_grace_s`: how long their
    running activities may go on once they are told to stop."""
    ev = ev if ev is not None else evaluator()
    settings = ev.settings
    print(host_summary(settings.wall), flush=True)
    root = work_root(settings.gpu_workdir)
    gone = scratch.remove_orphans(root)
    if gone:
        print(f"removed the scratch of {len(gone)} children of workers no longer running from {root}", flush=True)
    if selftest is None:
        selftest = settings.gpu_selftest
    # e.g. "kda,mla_decode" or "kda:B1 T32768 H32 D128": ceilings, oracle bank and the baseline's first call
    # (FLA autotunes), so that no candidate's verification pays for a first oracle
    warm_in_background(ev, warm_list(settings.warm_problem, settings.warm_shape),
                       all_shapes=bool(settings.warm_all_shapes) and ev.cuda)
    n = max_concurrent or settings.gpu_concurrency
    own = own_queue(task_queue)
    acts = gpu_activities(ev, own, bool(selftest))
    # `n` slots on each: new candidates enter by the shared queue, those already loaded here go on by their
    # own, so a worker busy with its candidates' later stages never starves them by taking new compiles
    workers = [Worker(client, task_queue=q, activities=acts,
                      activity_executor=ThreadPoolExecutor(max_workers=n + 1, thread_name_prefix="gpu-act"),
                      max_concurrent_activities=n, graceful_shutdown_timeout=timedelta(seconds=shutdown_grace_s))
               for q in (task_queue, own)]
    if selftest:
        selftest_in_background(ev, shutdown_from_thread(workers))
    return workers


def shutdown_from_thread(workers: list[Worker]):
    """A callable, for another thread, that shuts `workers` down on the event loop running now (the one that
    builds and runs them): they stop polling, and their queues' work goes to the other workers."""
    loop = asyncio.get_running_loop()
    pending: list[asyncio.Future] = []  # the loop holds tasks weakly

    def shut():
        pending.append(asyncio.gather(*(w.shutdown() for w in workers)))

    return lambda: loop.call_soon_threadsafe(shut)
