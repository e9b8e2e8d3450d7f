"""The run records in iteration order, so its oldest unrecorded iteration (the front) holds back every
verdict after it: its evaluation is told so, at its start or by the `front` signal once the iterations before
it are recorded, and its stages from then on go before those behind it in their task queues (priority 2
against the default; a crowned candidate's own checks keep 1). A stage already queued when the signal comes
keeps the priority it was scheduled with. Real workflow and dev server, synthetic GPU activities."""

from __future__ import annotations

import asyncio

from temporalio.api.enums.v1 import EventType

from tests import evaluators
from tests.workflows.helpers import assert_contiguous, start, workers
from workflows.contracts import RunSpec


async def _stages(client, run_id: str) -> dict[int, dict]:
    """Per iteration: whether it started at the front, when it was told later, and each GPU activity's
    (name, queue, priority key, scheduled, started) in the order scheduled."""
    out = {}
    async for w in client.list_workflows(f'WorkflowId STARTS_WITH "{run_id}-eval-"'):
        it = int(w.id.split("-eval-")[1].split("-")[0])
        ev = {"front_at_start": False, "told": None, "stages": []}
        started: dict[int, float] = {}
        async for e in client.get_workflow_handle(w.id).fetch_history_events():
            t = e.event_time.ToDatetime().timestamp()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                ev["front_at_start"] = b'"front":true' in b"".join(
                    p.data for p in e.workflow_execution_started_event_attributes.input.payloads)
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                if e.workflow_execution_signaled_event_attributes.signal_name == "front":
                    assert ev["told"] is None, f"#{it} told twice"
                    ev["told"] = (t, len(ev["stages"]))
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                a = e.activity_task_scheduled_event_attributes
                ev["stages"].append([a.activity_type.name, a.task_queue.name, a.priority.priority_key, t, None])
                started[e.event_id] = len(ev["stages"]) - 1
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                ev["stages"][started[e.activity_task_started_event_attributes.scheduled_event_id]][4] = t
        out[it] = ev
    return out


async def test_the_front_iteration_is_told_once_and_its_stages_go_first(env, store):
    evaluators.DELAY_S = 0.2  # the iterations behind the front are still under way when it is recorded
    try:
        spec = RunSpec(problem="softmax", budget={"iterations": 10}, population=4)
        async with workers(env.client):
            h = await start(env.client, spec, "front-told")
            res = await asyncio.wait_for(h.result(), 120)
    finally:
        evaluators.DELAY_S = 0.0
    assert_contiguous(store, res, 10)
    evs = await _stages(env.client, h.id)
    assert evs[1]["front_at_start"] and evs[1]["told"] is None  # nothing before it: the front from its start
    assert any(ev["told"] for ev in evs.values()), "no evaluation became the front while under way"
    for it, ev in evs.items():
        before = len(ev["stages"]) if not ev["front_at_start"] and ev["told"] is None else \
            0 if ev["front_at_start"] else ev["told"][1]
        # behind the front the default, at the front 2; a crowned candidate's checks 1 wherever it stands
        # (a candidacy at the front is answered, not told)
        keys = [k for _, _, k, _, _ in ev["stages"]]
        assert [k for k in keys[:before] if k != 1] == [0] * len([k for k in keys[:before] if k != 1]), (it, ev)
        assert all(k in (1, 2) for k in keys[before:]), (it, ev)
