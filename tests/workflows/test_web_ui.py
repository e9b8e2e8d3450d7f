"""What the Temporal Web UI and the CPU demo show: every execution of a run, after each continue-as-new
too, carries the run's summary and its current details (budget left, the crowned best and the leaderboard as
one numbered list); each evaluation's child workflow is summarized with the run's progress when it started
(the run's main page, its Timeline, labels the evaluations' rows with it); interpreter timings never appear as
speedups in the live view, the report or the UI."""

from __future__ import annotations

import asyncio
import io
import re

import pytest
from temporalio import activity

from tests import evaluators
from tests.workflows.helpers import run_id, start, workers
from tests.workflows.test_cli import marathon
from cli.query import run_report, watch
from workflows.text import iterations_text
from workflows.contracts import AGENT_QUEUE, BenchReport, BenchRequest, RunSpec
from workflows.optimization import KernelOptimization
from workflows.text import INTERPRETER_NOTE

RATIO = re.compile(r"\b\d+(\.\d+)?x\b")  # "1.15x", "0.03x"


async def _details(client, wid: str, run: str | None = None) -> str:
    meta = await client.get_workflow_handle(wid, run_id=run).query("__temporal_workflow_metadata")
    return meta.current_details


async def _executions(client, wid: str, n: int) -> list:
    """The run's n executions from visibility, which the dev server updates a moment after each closes."""
    for _ in range(100):
        found = [w async for w in client.list_workflows(f"WorkflowId = '{wid}'")]
        if len(found) >= n:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"visibility lists {len(found)} executions of {wid}, expected {n}")


async def test_every_execution_carries_summary_and_details_and_the_demo_shows_no_interpreter_ratio(env, store):
    address = env.client.service_client.config.target_host
    wid = run_id("webui")
    live = io.StringIO()
    async with workers(env.client):  # the synthetic evaluator: interpreter timings
        await asyncio.to_thread(marathon, "start", "softmax", "--iterations", "6", "--compact-every", "2",
                                "--id", wid, env_address=address, check=True)
        res = await asyncio.wait_for(watch(env.client, wid, interval=0.05, out=live), 120)
        assert res.runs == 3  # continued as new twice
        # watched once it has ended (as a run that ends between two polls): its last row, the last record
        ended = io.StringIO()
        await watch(env.client, wid, out=ended)
        last = ended.getvalue().splitlines()[-1]
        assert last.startswith("    6 done ") and " #6 " in last, ended.getvalue()
        summary = "softmax: search policy, budget 6 iterations"
        executions = await _executions(env.client, wid, 3)
        for ex in executions:
            assert (await ex.memo()) == {"summary": summary}
            text = await _details(env.client, wid, ex.run_id)
            assert text.startswith(f"**{summary}**\n") and "- best: " in text and INTERPRETER_NOTE in text
            assert not RATIO.search(text), text
        latest = await _details(env.client, wid)
        report = (await run_report(env.client, wid, store.root.parent / "report")).read_text()
        board = await env.client.get_workflow_handle(wid).query(KernelOptimization.leaderboard)

    # the latest details: the crowned best heads one numbered list with the rest of the leaderboard (the Web UI
    # runs a markdown table's headers together)
    assert "\n**Leaderboard** (interpreter time; the crowned best first)\n" in latest and "| " not in latest
    rows = [ln for ln in latest.splitlines() if ln[:1].isdigit()]
    assert rows[0] == (f"1. `{res.best.candidate_id}`: {res.best.time_ms:.4g} ms, iteration {res.best.iteration} "
                       f"(crowned best)")
    assert {e.candidate_id for e in board} <= {ln.split("`")[1] for ln in rows}
    # the result, which the Web UI shows first for a finished run, opens with a summary and has no ratio
    assert res.best.speedup is None and res.summary.startswith("6 iterations, stopped by budget-iterations; best: ")
    assert not re.search(r'"speedup":\s*[0-9]', res.model_dump_json()), res.model_dump_json()

    assert INTERPRETER_NOTE in live.getvalue() and INTERPRETER_NOTE in report
    for shown in (live.getvalue(), report):
        assert not RATIO.search(shown), RATIO.search(shown)
    assert f"ms under the interpreter ({res.best.candidate_id}" in report


async def _listed(client, query: str, n: int) -> list:
    """What visibility lists for `query` once it lists n (the dev server indexes a moment after each change)."""
    for _ in range(100):
        found = [w async for w in client.list_workflows(query)]
        if len(found) >= n:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"visibility lists {len(found)} for {query}, expected {n}")


async def test_each_evaluation_is_summarized_with_the_run_s_progress_and_listed_under_its_run(env, store):
    wid = run_id("progress")
    spec = RunSpec(problem="softmax", budget={"iterations": 5}, compact_every=2)
    async with workers(env.client):
        h = await env.client.start_workflow(KernelOptimization.run, spec, id=wid, task_queue=AGENT_QUEUE)
        res = await asyncio.wait_for(h.result(), 120)
        details = await _details(env.client, wid)
        # the query the docs give for a run with its evaluations, and the one for the runs alone
        children = await _listed(env.client, f"ParentWorkflowId = '{wid}'", 5)
        runs = await _listed(env.client, f"WorkflowType = 'KernelOptimization' AND WorkflowId = '{wid}'", 3)
        summaries = {}
        for c in children:
            summaries[c.id] = await (await env.client.get_workflow_handle(c.id).describe()).static_summary()
    assert res.runs == 3 and len(runs) == 3 and len(children) == 5
    assert {c.workflow_type for c in children} == {"EvaluateCandidate"}
    assert "\n- left: 0 iterations\n" in details
    by_iteration = {}
    for cid, text in summaries.items():
        n = int(cid.split("-eval-")[1].split("-")[0])
        assert cid.startswith(f"{wid}-eval-{n}-") and text.startswith(f"#{n} "), (cid, text)
        by_iteration[n] = text
    assert sorted(by_iteration) == [1, 2, 3, 4, 5]
    assert by_iteration[1].endswith(" | best none yet | left 5 iterations"), by_iteration[1]
    for n in range(2, 6):  # the best so far (its iteration before this one) and what the budget had left
        best, left = by_iteration[n].split(" | ")[1:]
        assert left == f"left {iterations_text(5 - (n - 1))}", by_iteration[n]
        found = re.fullmatch(r"best [\d.]+ ms \(#(\d+), interpreter\)", best)
        assert found and int(found.group(1)) < n, by_iteration[n]
    assert f"(#{res.best.iteration}, interpreter)" in by_iteration[5] or res.best.iteration == 5
    assert not any(RATIO.search(t) for t in by_iteration.values()), by_iteration


@activity.defn(name="benchmark_candidate")
def gpu_timed_benchmark(req: BenchRequest) -> BenchReport:
    """The synthetic benchmark as if timed on a GPU."""
    return evaluators.benchmark_candidate(req).model_copy(update={"interpreter": False})


async def test_gpu_timings_show_as_speedups_with_the_crowned_best_first(env, store):
    gpu = [evaluators.compile_candidate, evaluators.verify_candidate, gpu_timed_benchmark,
           evaluators.profile_candidate]
    async with workers(env.client, gpu_activities=gpu):
        h = await start(env.client, RunSpec(problem="softmax", budget={"iterations": 6}, compact_every=3), "gpuui")
        res = await asyncio.wait_for(h.result(), 120)
        text = await _details(env.client, h.id)
        query = f"ParentWorkflowId = '{h.id}' AND WorkflowId STARTS_WITH '{h.id}-eval-6-'"
        last = (await _listed(env.client, query, 1))[0]
        last_summary = await (await env.client.get_workflow_handle(last.id).describe()).static_summary()
    b = res.best
    progress = r"#6 \w+ \| best [\d.]+x, [\d.]+ ms \(#[1-5]\) \| left 1 iteration"
    assert re.fullmatch(progress, last_summary), last_summary
    assert not b.interpreter and res.runs == 2 and INTERPRETER_NOTE not in text
    assert f"- best: {b.speedup:.3g}x, {b.time_ms:.4g} ms vs baseline {b.baseline_ms:.4g} ms" in text
    assert "\n**Leaderboard** (speedup, device time; the crowned best first)\n" in text
    rows = [ln for ln in text.splitlines() if ln[:1].isdigit()]
    assert rows[0] == f"1. `{b.candidate_id}`: {b.speedup:.3g}x, {b.time_ms:.4g} ms, iteration {b.iteration} (crowned best)"
    desc = await h.describe()
    sa = {k.name: v for k, v in desc.typed_search_attributes.search_attributes}
    assert sa["MarathonBestSpeedup"] == b.speedup


@pytest.mark.xfail(strict=True, reason="temporalio 1.35's workflow.continue_as_new takes no static summary or "
                                       "details, and neither does the continue-as-new command it sends")
async def test_the_start_summary_reaches_the_run_started_by_continue_as_new(env, store):
    # what the Web UI shows as a run's summary, read back by describe: the first execution's is the one the
    # client set; the continued one's must be the same. When it holds, pass the summary and details on in
    # workflow.continue_as_new and drop this mark (strict: the test fails as soon as it passes).
    wid = run_id("summary")
    spec = RunSpec(problem="softmax", budget={"iterations": 2}, compact_every=1)
    async with workers(env.client):
        h = await env.client.start_workflow(KernelOptimization.run, spec, id=wid, task_queue=AGENT_QUEUE,
                                            static_summary="summary of the run", static_details="details")
        res = await asyncio.wait_for(h.result(), 60)
        first = await env.client.get_workflow_handle(wid, run_id=h.first_execution_run_id).describe()
        latest = await env.client.get_workflow_handle(wid).describe()
    assert res.runs == 2 and latest.run_id != first.run_id
    assert await first.static_summary() == "summary of the run"
    assert await latest.static_summary() == "summary of the run"
    assert await latest.static_details() == "details"
