"""The KernelOptimization workflow against the real dev server: continue-as-new, controls, budgets."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from temporalio.client import WorkflowUpdateFailedError

from activities.ledger import read_ledger
from tests import evaluators
from tests.workflows.helpers import assert_contiguous, start as _start, until as _until, workers
from workflows.contracts import BudgetChange, EvalRequest, Hint, RunResult, RunSpec, StopRequest
from workflows.optimization import KernelOptimization


async def test_continue_as_new_keeps_iterations_contiguous(env, store):
    spec = RunSpec(problem="softmax", budget={"iterations": 23}, compact_every=5)
    async with workers(env.client):
        h = await _start(env.client, spec, "can")
        res = await h.result()
    assert isinstance(res, RunResult)
    assert res.stopped_by == "budget-iterations"
    assert res.runs == 5  # compactions after 5, 10, 15, 20; 21-23 finish in the fifth run
    assert_contiguous(store, res, 23)
    recs = read_ledger(store, res.ledger_key)
    assert len({r.candidate_id for r in recs}) == 23, "the search never proposes a candidate twice"
    # the crowned best is the fastest (the synthetic timings are interpreter times: the result has no speedup)
    assert res.best is not None and res.best.speedup is None
    assert res.best.candidate_id == max((r for r in recs if r.speedup), key=lambda r: r.speedup).candidate_id
    # the notebook is versioned: one version per compaction, each naming its predecessor
    text = store.get_text(res.notebook_key)
    assert text.startswith("# Notebook: softmax, version 5")
    assert "previous version: " in text and "none" not in text.splitlines()[1]


async def test_search_is_reproducible_for_a_seed(env, store):
    async def candidates(seed):
        spec = RunSpec(problem="softmax", budget={"iterations": 8}, compact_every=4, seed=seed)
        h = await _start(env.client, spec, f"seed{seed}")
        res = await h.result()
        return [r.candidate_id for r in read_ledger(store, res.ledger_key)]

    async with workers(env.client):
        a, b, c = await candidates(1), await candidates(1), await candidates(2)
    assert a == b
    assert a != c


async def test_population_evaluates_in_parallel_with_unique_numbers(env, store):
    spec = RunSpec(problem="softmax", budget={"iterations": 10}, compact_every=4, population=3)
    async with workers(env.client):
        res = await (await _start(env.client, spec, "pop")).result()
    assert_contiguous(store, res, 10)  # the last step is capped at the one iteration left
    recs = read_ledger(store, res.ledger_key)
    assert [r.slot for r in recs[:3]] == [0, 1, 2]
    assert len({r.candidate_id for r in recs}) == 10


async def test_run_is_evaluated_on_its_gpu_queue(env, store):
    # only a GPU worker on the run's own queue is polling: the run finishes only if every GPU activity
    # was routed there (on the default queue nobody would ever pick them up)
    spec = RunSpec(problem="softmax", budget={"iterations": 4}, population=2, gpu_queue="h200-pool.b")
    async with workers(env.client, gpu_queue="h200-pool.b"):
        res = await asyncio.wait_for((await _start(env.client, spec, "queue")).result(), 60)
    assert_contiguous(store, res, 4)


async def test_population_rolls_past_a_slow_evaluation(env, store):
    # Population 3, every third iteration slow to compile: the others keep starting new candidates
    # instead of waiting for the slow one at a step boundary, and the ledger still records 1..12 in order.
    evaluators.SLOW_EVERY, evaluators.SLOW_S = 3, 1.5
    try:
        spec = RunSpec(problem="softmax", budget={"iterations": 12}, compact_every=6, population=3)
        async with workers(env.client):
            res = await (await _start(env.client, spec, "roll")).result()
    finally:
        evaluators.SLOW_EVERY, evaluators.SLOW_S = 0, 0.0
    assert_contiguous(store, res, 12)
    recs = read_ledger(store, res.ledger_key)
    assert res.runs == 2 and len({r.candidate_id for r in recs}) == 12
    slow = recs[0]  # iteration 1
    overtook = [r.iteration for r in recs if r.iteration >= 4 and r.started_at < slow.finished_at]
    assert overtook, "no candidate started while the slow first one was still compiling"
    # each knows when its own stages answered, before or when it ended (a candidacy waits for the run's answer)
    assert all(r.started_at < r.judged_at <= r.finished_at for r in recs)
    assert max(r.slot for r in recs) == 2


async def test_set_budget_validator_rejects_before_recording(env, store):
    evaluators.DELAY_S = 0.3
    try:
        async with workers(env.client):
            h = await _start(env.client, RunSpec(problem="softmax", budget={"iterations": 50}), "budget")
            await _until(lambda s: s.iteration >= 2, h)
            for bad, msg in (({"iterations": 0}, "must be positive"), ({"hours": -1}, "must be positive"),
                             ({"iterations": 1}, "below"), ({"bogus": 3}, "bogus"), ({}, "at least one")):
                with pytest.raises(WorkflowUpdateFailedError) as e:
                    await h.execute_update("set_budget", bad)
                assert msg in str(e.value.cause), (bad, str(e.value.cause))
            budget = await h.execute_update(KernelOptimization.set_budget, BudgetChange(iterations=6, hours=2))
            assert budget.iterations == 6 and budget.hours == 2
            res = await h.result()
        assert res.iterations == 6 and res.stopped_by == "budget-iterations"
        # rejected updates left no trace in history: only the accepted one was recorded
        hist = await h.fetch_history()
        accepted = [e for e in hist.events if e.HasField("workflow_execution_update_accepted_event_attributes")]
        assert len(accepted) == 1
    finally:
        evaluators.DELAY_S = 0.0


async def test_pause_resume_hint_stop(env, store):
    evaluators.DELAY_S = 0.2
    try:
        async with workers(env.client):
            t_start = time.monotonic()
            h = await _start(env.client, RunSpec(problem="softmax", budget={"iterations": 200}), "ctl")
            await _until(lambda s: s.iteration >= 2, h)
            await h.signal(KernelOptimization.pause)
            st = await _until(lambda s: s.phase == "paused", h)
            assert st.paused and st.pause_reason == "paused by operator"
            frozen = st.iteration
            await asyncio.sleep(1.5)
            assert (await h.query(KernelOptimization.status)).iteration == frozen
            await h.signal(KernelOptimization.hint, Hint(text="try BLOCK_N=2048 please"))
            await h.signal(KernelOptimization.resume)
            st = await _until(lambda s: s.iteration >= frozen + 2, h)
            # the paused stretch counts against no budget: it is kept apart from the run's seconds
            assert st.used.paused_seconds >= 1.4, st.used
            assert st.used.seconds <= time.monotonic() - t_start - 1.2, st.used
            await h.signal(KernelOptimization.stop, StopRequest(reason="test"))
            res = await h.result()
            board = await h.query(KernelOptimization.leaderboard)
        assert res.stopped_by == "stop-signal"
        assert res.reverified is True
        recs = read_ledger(store, res.ledger_key)
        hinted = recs[frozen]  # the first iteration after the hint
        assert hinted.knobs["BLOCK_N"] == 2048 and hinted.rationale.startswith("hint: BLOCK_N=2048")
        assert_contiguous(store, res, res.iterations)
        assert board == sorted(board, key=lambda e: -e.speedup) and len(board) <= 8
    finally:
        evaluators.DELAY_S = 0.0


async def test_status_and_search_attributes(env, store):
    async with workers(env.client):
        h = await _start(env.client, RunSpec(problem="softmax", budget={"iterations": 4}, compact_every=2), "sa")
        res = await h.result()
        st = await h.query(KernelOptimization.status)
    assert st.iteration == 4 and st.phase == "done" and st.runs == res.runs == 2
    assert st.best.candidate_id == res.best.candidate_id
    desc = await h.describe()
    sa = {k.name: v for k, v in desc.typed_search_attributes.search_attributes}
    assert sa["MarathonProblem"] == "softmax" and sa["MarathonIteration"] == 4
    assert sa["MarathonPhase"] == "done"
    # the synthetic evaluator reports interpreter timings, whose ratios are not published as speedups
    assert res.best.interpreter and "MarathonBestSpeedup" not in sa


@pytest.mark.slow
@pytest.mark.parametrize("population", [1, 3])
async def test_unwritable_artifact_store_pauses_without_a_corrupt_record(env, store, population):
    """The store breaks mid-run (its objects directory replaced by a file: even root cannot write there):
    the run pauses with a clear reason and records nothing for the broken step; once the store is back,
    `resume` carries on with the same iteration numbers. With a rolling population of 3, evaluations in
    flight when it breaks are drained: those before the first failure are recorded, the rest retried."""
    import shutil

    evaluators.DELAY_S = 0.2
    objects = store.root / "objects"
    moved = store.root / "objects.saved"
    try:
        async with workers(env.client):
            h = await _start(env.client, RunSpec(problem="softmax", budget={"iterations": 12}, compact_every=4,
                                                 heartbeat_seconds=5, population=population), "store")
            await _until(lambda s: s.iteration >= 2, h)
            objects.rename(moved)
            objects.write_text("not a directory")
            st = await _until(lambda s: s.phase == "paused", h, timeout=120)
            reason = st.pause_reason
            assert st.paused and "artifact store" in reason and ("not writable" in reason or "unusable" in reason), \
                reason
            frozen = st.iteration
            await asyncio.sleep(1.0)
            assert (await h.query(KernelOptimization.status)).iteration == frozen
            objects.unlink()
            moved.rename(objects)
            await h.signal(KernelOptimization.resume)
            res = await asyncio.wait_for(h.result(), 300)  # paused again: a failure, not a hang
        assert_contiguous(store, res, 12)
        assert store.verify_all() == []
    finally:
        evaluators.DELAY_S = 0.0
        if moved.exists():
            if objects.is_file():
                objects.unlink()
            shutil.rmtree(objects, ignore_errors=True)
            moved.rename(objects)


async def test_evaluations_go_on_across_continue_as_new(env, store):
    # Population 4, a compaction every 6: each continue-as-new happens with evaluations under way. Each is a
    # child workflow that outlives the run and signals its result to the run's workflow id: the next run
    # records it, and no evaluation is started (compiled) twice.
    evaluators.DELAY_S = 0.3
    evaluators.REQUESTS.clear()
    try:
        spec = RunSpec(problem="softmax", budget={"iterations": 16}, compact_every=6, population=4)
        async with workers(env.client):
            h = await _start(env.client, spec, "carry")
            res = await h.result()
    finally:
        evaluators.DELAY_S = 0.0
    assert_contiguous(store, res, 16)
    # a compaction after 6 records at least (results arriving together are recorded together, so the second
    # run can reach the budget before its own compaction point)
    assert res.runs >= 2
    recs = read_ledger(store, res.ledger_key)
    assert len({r.candidate_id for r in recs}) == 16
    compiled = [EvalRequest.model_validate_json(body).iteration for name, _, body in evaluators.REQUESTS
                if name == "compile_candidate"]
    assert sorted(compiled) == list(range(1, 17)), "an evaluation was started again"
    started, delivered = {}, {}  # iteration -> the run that started its child / received its result
    async for ex in env.client.list_workflows(f"WorkflowId = '{h.id}'"):
        async for e in env.client.get_workflow_handle(h.id, run_id=ex.run_id).fetch_history_events():
            if e.HasField("start_child_workflow_execution_initiated_event_attributes"):
                it = int(e.start_child_workflow_execution_initiated_event_attributes.workflow_id.split("-eval-")[1]
                         .split("-")[0])
                started[it] = ex.run_id
            elif e.HasField("workflow_execution_signaled_event_attributes"):
                sig = e.workflow_execution_signaled_event_attributes
                if sig.signal_name == "evaluated":
                    it = json.loads(sig.input.payloads[0].data)["iteration"]
                    delivered[it] = ex.run_id
    assert sorted(started) == sorted(delivered) == list(range(1, 17))
    assert any(started[it] != delivered[it] for it in started), "no evaluation was under way at a compaction"
