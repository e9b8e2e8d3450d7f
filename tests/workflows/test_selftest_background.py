"""A GPU worker serves while its start-up self-test runs (gpu_worker.worker.selftest_in_background): one
candidate's EvaluateCandidate against the real GPU activities (Triton interpreter) on a real server. Its
compile and verification are served before the self-test's verdict, its benchmark heartbeats waiting for it;
the self-test fails, the worker stops, and the benchmark's failure is infrastructure: the evaluation is taken
up by another worker and recorded from there, never as a rejection. Only the canaries' outcome is set by
hand, as run_canaries' result, which the evaluator's own self-test settles its verdict with (the canaries
themselves: tests/gpu_worker/test_activities.py)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from temporalio.worker import Worker

from activities.worker import build_agent_worker
from tests.gpu_worker.harnesses import canary
from workflows.contracts import AGENT_QUEUE, Candidate, EvaluateRequest, EvaluationResult
from workflows.evaluation import EVALUATE_TYPE

FAILED = {"ok": False, "problems": ["the wrong canary passed verification"]}


@pytest.fixture
def gpu_side(store, monkeypatch, tmp_path):
    """The interpreter's evaluator as the GPU worker's, its canaries held until the test gives their outcome;
    `runs` counts the self-tests started. Its caches are its own: a pass another test kept is not reused."""
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.settings import GpuWorkerSettings

    ev = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0),
                   settings=GpuWorkerSettings(cache_dir=tmp_path / "cache"))
    outcome: dict = {}
    release = threading.Event()
    runs: list[int] = []

    def held_canaries(evaluator, hb=None):
        runs.append(1)
        release.wait(600)
        return dict(outcome)

    monkeypatch.setattr("gpu_worker.canaries.run_canaries", held_canaries)
    yield ev, outcome, release, runs
    release.set()
    ev.close()


async def _pending(handle, name: str):
    for p in (await handle.describe()).raw_description.pending_activities:
        if p.activity_type.name == name:
            return p
    return None


async def _until(predicate, within: float, what: str):
    deadline = asyncio.get_running_loop().time() + within
    while True:
        got = await predicate()
        if got:
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {within:g} s: {what}")
        await asyncio.sleep(0.5)


@pytest.mark.slow(35)
async def test_a_worker_serves_before_its_selftest_and_stops_when_it_fails(env, store, gpu_side, capsys):
    from temporalio.api.enums.v1 import EventType, PendingActivityState

    from gpu_worker.worker import build_gpu_workers
    from tests import evaluators

    ev, outcome, release, _ = gpu_side
    queue = f"selftest-bg-{uuid.uuid4().hex[:8]}"
    # a grace as `marathon worker` gives (MARATHON_SHUTDOWN_GRACE_S): the benchmark waiting on the verdict
    # completes its refusal before the stop; with none, the stop may cancel it first (a WorkerShutdown failure)
    gpu = build_gpu_workers(env.client, task_queue=queue, selftest=True, max_concurrent=2, ev=ev,
                            shutdown_grace_s=30)
    verdict = ev.selftest_verdict
    runs = [asyncio.create_task(w.run()) for w in gpu]
    src = canary("fast")
    cand = Candidate(candidate_id=uuid.uuid4().hex[:16], source_key=store.put_text(src))
    try:
        async with build_agent_worker(env.client):
            h = await env.client.start_workflow(
                EVALUATE_TYPE, EvaluateRequest(problem="softmax", iteration=1, candidate=cand, gpu_queue=queue,
                                               heartbeat_seconds=5),
                id=f"eval-{queue}", task_queue=AGENT_QUEUE, result_type=EvaluationResult)

            async def benchmark_waiting():
                p = await _pending(h, "benchmark_candidate")
                return p if p is not None and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED \
                    and p.last_heartbeat_time.seconds else None

            # compiled and verified (the benchmark is scheduled only after both passed), and heartbeating
            await _until(benchmark_waiting, 300, "the benchmark started and heartbeating")
            assert not verdict.settled and all(w.is_running for w in gpu)

            outcome.update(FAILED)
            release.set()
            await asyncio.wait_for(asyncio.gather(*runs), 60)  # both of the worker's Temporal workers stop
            assert verdict.failed and not any(w.is_running for w in gpu)
            assert "GPU worker self-test failed, refusing to serve: the wrong canary passed verification" \
                in capsys.readouterr().out

            async def refused():
                async for e in h.fetch_history_events():
                    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
                        return e.activity_task_failed_event_attributes.failure
                return None

            failure = await _until(refused, 30, "the benchmark's failure recorded")
            assert failure.application_failure_info.type == "SelfTestFailed" \
                and not failure.application_failure_info.non_retryable

            # another worker on the queue takes the evaluation up and records its verdict
            standin = Worker(env.client, task_queue=queue, activities=evaluators.SYNTHETIC_GPU_ACTIVITIES,
                             activity_executor=ThreadPoolExecutor(2), max_concurrent_activities=2)
            async with standin:
                res = await asyncio.wait_for(h.result(), 120)
    finally:
        release.set()
        for w in gpu:
            await w.shutdown()
    assert res.failure is None and res.record is not None
    assert res.record.outcome in ("passed", "improved") and res.record.time_ms is not None, res.record
    # from compile again at once: the refusal on the stopped worker's own queue was not tried there again
    hist = await h.fetch_history()
    compiles = [e for e in hist.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and e.activity_task_scheduled_event_attributes.activity_type.name == "compile_candidate"]
    assert len(compiles) == 2


async def test_with_the_selftest_off_nothing_waits(env, gpu_side):
    from gpu_worker.worker import build_gpu_workers

    ev, outcome, release, runs = gpu_side
    build_gpu_workers(env.client, task_queue=f"selftest-off-{uuid.uuid4().hex[:8]}", selftest=False,
                      max_concurrent=1, ev=ev)
    await asyncio.sleep(0.5)
    assert runs == [] and not ev.selftest_verdict.settled
