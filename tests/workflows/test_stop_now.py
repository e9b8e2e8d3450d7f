"""A stop where no GPU worker polls the run's queue: the plain stop waits for the evaluations under way (and
`marathon stop` and `pause` say so, naming `--now`); a stop with `now` cancels them, records none of them, skips the
best's re-verification and ends the run."""

from __future__ import annotations

import asyncio
import uuid

from temporalio.client import WorkflowExecutionStatus

from activities.worker import build_agent_worker
from cli import main
from tests.workflows.helpers import start as _start, until as _until
from workflows.contracts import RunSpec
from workflows.optimization import KernelOptimization


async def test_a_stop_with_now_cancels_evaluations_nobody_runs(env, store, capsys):
    queue = f"marathon-gpu-unpolled-{uuid.uuid4().hex[:8]}"  # no worker ever polls it
    spec = RunSpec(problem="softmax", budget={"iterations": 50}, population=2, gpu_queue=queue)
    async with build_agent_worker(env.client):
        h = await _start(env.client, spec, "stopnow")
        await _until(lambda s: s.phase == "evaluating", h)
        address = env.client.service_client.config.target_host
        capsys.readouterr()
        rc = await asyncio.to_thread(main, ["pause", h.id, "--address", address])
        err = capsys.readouterr().err
        assert rc == 0 and "the pause waits for the evaluations under way until then" in err, err
        await h.signal(KernelOptimization.resume)
        rc = await asyncio.to_thread(main, ["stop", h.id, "--reason", "no gpu", "--address", address])
        err = capsys.readouterr().err
        assert rc == 0
        assert f"no GPU worker is polling task queue {queue}" in err and f"marathon stop {h.id} --now" in err, err
        await asyncio.sleep(2)
        st = await h.query(KernelOptimization.status)
        assert (await h.describe()).status == WorkflowExecutionStatus.RUNNING  # the plain stop waits
        assert st.stop_reason == "no gpu" and st.iteration == 0
        await h.signal(KernelOptimization.stop, {"reason": "now, please", "now": True})
        res = await asyncio.wait_for(h.result(), 60)
        children = [c async for c in env.client.list_workflows(f'WorkflowId STARTS_WITH "{h.id}-eval-"')]
    assert res.stopped_by == "stop-signal" and res.stop_reason == "now, please"
    assert res.iterations == 0 and res.cancelled == [1, 2] and res.reverified is None, res
    assert "2 evaluations under way cancelled" in res.summary, res.summary
    assert len(children) == 2
    for c in children:
        assert (await env.client.get_workflow_handle(c.id).describe()).status == WorkflowExecutionStatus.CANCELED

