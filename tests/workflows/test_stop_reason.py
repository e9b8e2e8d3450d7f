"""A stop is kept with its reason: one that arrives while a run compacts, just before it continues as new,
ends the next run at once instead of being dropped with the old one."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from temporalio import activity
from temporalio.worker import Worker

from activities.agent import AgentActivities
from activities.settings import AgentSettings
from activities.worker import WORKFLOWS, agent_activities
from tests.evaluators import SYNTHETIC_GPU_ACTIVITIES
from tests.workflows.helpers import assert_contiguous, start
from workflows.contracts import AGENT_QUEUE, GPU_QUEUE, CompactRequest, CompactResult, RunSpec, StopRequest
from workflows.optimization import KernelOptimization

ENTERED, RELEASE = threading.Event(), threading.Event()


@activity.defn(name="compact_notebook")
def held_compaction(req: CompactRequest) -> CompactResult:
    """The real compaction, held at the first one until the test has sent its stop."""
    if not req.final and not ENTERED.is_set():
        ENTERED.set()
        RELEASE.wait(30)
    return AgentActivities(AgentSettings.from_env()).compact_notebook(req)


async def test_a_stop_during_the_compaction_ends_the_next_run_with_its_reason(env, store):
    acts = [a for a in agent_activities() if a.__name__ != "compact_notebook"] + [held_compaction]
    agent = Worker(env.client, task_queue=AGENT_QUEUE, workflows=WORKFLOWS, activities=acts,
                   activity_executor=ThreadPoolExecutor(4), max_concurrent_activities=4)
    gpu = Worker(env.client, task_queue=GPU_QUEUE, activities=SYNTHETIC_GPU_ACTIVITIES,
                 activity_executor=ThreadPoolExecutor(4), max_concurrent_activities=4)
    async with agent, gpu:
        h = await start(env.client, RunSpec(problem="softmax", budget={"iterations": 40}, compact_every=2), "stopc")
        assert await asyncio.to_thread(ENTERED.wait, 30)
        await h.signal(KernelOptimization.stop, StopRequest(reason="stopped mid-compaction"))
        await asyncio.sleep(0.5)  # the signal is recorded while the compaction is still held
        RELEASE.set()
        res = await asyncio.wait_for(h.result(), 120)
        st = await h.query(KernelOptimization.status)
    assert res.stopped_by == "stop-signal" and res.stop_reason == "stopped mid-compaction"
    assert st.stop_reason == "stopped mid-compaction"
    assert res.runs == 2 and res.iterations == 2  # the next run ended before proposing anything
    assert_contiguous(store, res, 2)
