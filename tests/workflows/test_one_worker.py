"""One candidate, one GPU worker: a candidate's verify and benchmark go to the queue of the worker that
compiled it, so with several GPU workers on one queue nothing is loaded and compiled twice, and the
workers' devices add up. A worker that goes away after a compile costs its candidates a new evaluation
from compile, never a lost record.

Real workflow and dev server; the GPU workers are stand-ins (tests/workflows/standin_gpu.py) whose device
time is a sleep under a per-worker lock: on this host's two shared cores, real interpreter workers are
CPU-bound and could not show two devices adding up. tests/workflows/test_one_worker_real.py runs the
real harness on two worker processes for the routing alone."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from activities.ledger import read_ledger
from activities.worker import build_agent_worker
from tests.workflows import standin_gpu
from tests.workflows.helpers import assert_contiguous, start
from tests.workflows.standin_gpu import COMPILES, STAGES, StandInGpu
from workflows.contracts import RunSpec


# a candidate's device seconds; compiles (0.3 s) overlap them
DEVICE = {"verify_s": 0.4, "bench_s": 0.6}


def env_store():
    from workflows.artifacts import ArtifactStore

    return ArtifactStore()


async def _run(env, gpus: list, spec: RunSpec, prefix: str):
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(build_agent_worker(env.client))
        for g in gpus:
            for w in await g.workers(env.client):
                await stack.enter_async_context(w)
        res = await asyncio.wait_for((await start(env.client, spec, prefix)).result(), 120)
    # the evaluations' span: from the first start to the last record (not the run's start-up and compaction)
    recs = read_ledger(env_store(), res.ledger_key)
    return res, max(r.finished_at for r in recs) - min(r.started_at for r in recs)


def _workers_by_candidate() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for _, cid, worker, _ in STAGES:
        out.setdefault(cid, set()).add(worker)
    return out


@pytest.mark.slow(30)
async def test_each_candidate_stays_on_its_worker_and_two_workers_add_up(env, store):
    spec = RunSpec(problem="softmax", budget={"iterations": 12}, population=6)
    standin_gpu.reset()
    res1, one = await _run(env, [StandInGpu("a", **DEVICE)], spec, "one-gpu")
    assert_contiguous(store, res1, 12)
    assert set(COMPILES.values()) == {1}, COMPILES

    standin_gpu.reset()
    res2, two = await _run(env, [StandInGpu("a", **DEVICE), StandInGpu("b", **DEVICE)], spec, "two-gpus")
    assert_contiguous(store, res2, 12)
    assert len(COMPILES) == 12 and set(COMPILES.values()) == {1}, COMPILES  # no stage loaded its candidate again
    placed = _workers_by_candidate()
    assert all(len(w) == 1 for w in placed.values()), placed  # every stage where its compile ran
    assert {w for ws in placed.values() for w in ws} == {"a", "b"}
    # the devices add up: they worked at the same time (the wall-clock ratio, 1.5-2x on a quiet host, is
    # the host's to keep on two shared cores, so it is printed rather than asserted)
    device_s = sum(e - s for _, s, e in standin_gpu.DEVICE_SPANS)
    both = standin_gpu.both_busy_s("a", "b")
    print(f"one worker {one:.1f} s, two {two:.1f} s; device {device_s:.1f} s, both busy {both:.1f} s")
    assert both >= 0.25 * device_s, f"both devices busy {both:.1f} s of {device_s:.1f} s of device time"

    # without a queue of their own the stages land on either worker, which loads and compiles again
    standin_gpu.reset()
    res3, _ = await _run(env, [StandInGpu("a", sticky=False), StandInGpu("b", sticky=False)], spec, "scattered")
    assert_contiguous(store, res3, 12)
    assert sum(COMPILES.values()) > 12, COMPILES


async def test_a_worker_gone_after_compiling_costs_a_new_evaluation_not_a_record(env, store):
    """Worker a compiles and then goes away (its own queue was never polled: it died as the compile
    reported); the stage waits 5 heartbeats there, and the candidate is evaluated again from compile on the
    shared queue, which worker b serves by then."""
    standin_gpu.reset()
    a, b = StandInGpu("a"), StandInGpu("b")
    loop = asyncio.get_running_loop()
    compiled_on_a = asyncio.Event()
    first: list[str] = []

    def gone_after_first_compile(req):
        first.append(req.candidate_id)
        loop.call_soon_threadsafe(compiled_on_a.set)

    a.on_compile = gone_after_first_compile
    spec = RunSpec(problem="softmax", budget={"iterations": 4}, population=2, heartbeat_seconds=2)
    async with build_agent_worker(env.client):
        a_shared = (await a.workers(env.client))[0]
        async with a_shared:
            h = await start(env.client, spec, "worker-gone")
            await asyncio.wait_for(compiled_on_a.wait(), 30)
        async with contextlib.AsyncExitStack() as stack:
            for w in await b.workers(env.client):
                await stack.enter_async_context(w)
            res = await asyncio.wait_for(h.result(), 120)
    assert_contiguous(store, res, 4)
    on_a = [cid for stage, cid, w, _ in STAGES if w == "a"]
    assert on_a and all(s == "compile" for s, _, w, _ in STAGES if w == "a")
    assert COMPILES[first[0]] == 2, STAGES  # compiled on a, then again on b
    for cid in on_a:  # (a compile a was still running when it stopped was retried on b, compiled once)
        assert {s for s, c, w, _ in STAGES if c == cid and w == "b"} >= {"compile", "verify", "benchmark"}
    recs = read_ledger(store, res.ledger_key)
    assert all(r.outcome in ("passed", "improved", "rejected") for r in recs)


async def test_a_worker_gone_in_the_middle_of_a_stage_costs_a_new_evaluation(env, store):
    """Worker a stops while a verification of one of its candidates runs: the stage, tried once on a's own
    queue, fails there, and the candidate is evaluated again from compile on worker b at once (no retry
    waiting on a queue nobody polls)."""
    standin_gpu.reset()
    a, b = StandInGpu("a", verify_s=30.0), StandInGpu("b")
    loop = asyncio.get_running_loop()
    verifying_on_a = asyncio.Event()
    a.on_verify = lambda req: loop.call_soon_threadsafe(verifying_on_a.set)
    spec = RunSpec(problem="softmax", budget={"iterations": 1}, population=1, heartbeat_seconds=2)
    async with build_agent_worker(env.client):
        stack = contextlib.AsyncExitStack()
        for w in await a.workers(env.client):
            await stack.enter_async_context(w)
        h = await start(env.client, spec, "worker-gone-mid-stage")
        await asyncio.wait_for(verifying_on_a.wait(), 30)
        await stack.aclose()
        async with contextlib.AsyncExitStack() as stack_b:
            for w in await b.workers(env.client):
                await stack_b.enter_async_context(w)
            res = await asyncio.wait_for(h.result(), 120)
    assert_contiguous(store, res, 1)
    on_a = [s for s, _, w, _ in STAGES if w == "a"]
    # (the compile sent back at once may meet a's shared-queue worker still stopping: refused there, retried)
    assert on_a[:2] == ["compile", "verify"] and set(on_a[2:]) <= {"compile"}, STAGES
    assert [s for s, _, w, _ in STAGES if w == "b"][:3] == ["compile", "verify", "benchmark"], STAGES
    from temporalio.api.enums.v1 import EventType

    (child,) = [w async for w in env.client.list_workflows(f'WorkflowId STARTS_WITH "{h.id}-eval-"')]
    events = (await env.client.get_workflow_handle(child.id).fetch_history()).events
    on_a = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.task_queue.name == a.own]
    assert len(on_a) == 1 and on_a[0].activity_task_scheduled_event_attributes.retry_policy.maximum_attempts == 1
    assert not any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT for e in events), "waited on a"


async def test_an_error_under_a_live_worker_is_tried_again_there(env, store):
    """A verification that fails once on its worker (an error, not the worker gone) is tried again on that
    worker's own queue, a second later: the candidate is not compiled again."""
    standin_gpu.reset()
    a = StandInGpu("a")
    failed: list[str] = []

    def fail_first(req):
        if not failed:
            failed.append(req.candidate_id)
            raise RuntimeError("a transient fault under a live worker")

    a.on_verify = fail_first
    spec = RunSpec(problem="softmax", budget={"iterations": 1}, population=1, heartbeat_seconds=2)
    res, _ = await _run(env, [a], spec, "error-on-worker")
    assert_contiguous(store, res, 1)
    assert [(s, w) for s, _, w, _ in STAGES][:4] == [("compile", "a"), ("verify", "a"), ("verify", "a"),
                                                      ("benchmark", "a")], STAGES
    assert COMPILES[failed[0]] == 1, COMPILES
