"""Record the replay fixtures in tests/histories/ with today's code: `python -m tests.workflows.make_histories`.

Records one run of every kind of history the workflow makes: a run that ends in continue-as-new after
a compaction with evaluations under way (their results arrive in the next run), with a signal, an accepted
and a rejected budget update, a pause and resume; the final run that completes; and one evaluation's
child workflow. A change that alters the command sequence of a supported version goes behind
`workflow.patched`, and its fixtures are recorded beside these (docs/architecture.md, Versioning)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.conftest import temporal_path
from tests.workflows.helpers import workers
from cli.server import dev_server_config_args
from workflows.contracts import AGENT_QUEUE, Hint, RunSpec
from workflows.optimization import KernelOptimization
from workflows.run_view import SEARCH_ATTRIBUTES

OUT = Path(__file__).resolve().parent.parent / "histories"


async def main(prefix: str) -> None:
    os.environ["MARATHON_ARTIFACTS"] = tempfile.mkdtemp()
    env = await WorkflowEnvironment.start_local(data_converter=pydantic_data_converter,
                                                dev_server_existing_path=temporal_path(),
                                                search_attributes=SEARCH_ATTRIBUTES,
                                                dev_server_extra_args=dev_server_config_args())
    from tests import evaluators

    # every third candidate compiles slowly, so the rolling population really overlaps and some evaluations
    # are still under way at a compaction
    evaluators.SLOW_EVERY, evaluators.SLOW_S = 3, 0.5
    try:
        async with workers(env.client):
            spec = RunSpec(problem="softmax", budget={"iterations": 8}, compact_every=4, population=2)
            h = await env.client.start_workflow(KernelOptimization.run, spec, id="replay-fixture",
                                                task_queue=AGENT_QUEUE)
            await h.signal(KernelOptimization.hint, Hint(text="BLOCK_N=512"))
            await h.signal(KernelOptimization.pause)
            await asyncio.sleep(1)
            await h.signal(KernelOptimization.resume)
            try:
                await h.execute_update("set_budget", {"iterations": 0})
            except Exception:
                pass
            await h.execute_update("set_budget", {"iterations": 10})
            await h.result()
        runs = [w async for w in env.client.list_workflows("WorkflowId = 'replay-fixture'")]
        OUT.mkdir(exist_ok=True)
        for i, w in enumerate(sorted(runs, key=lambda w: w.start_time)):
            hist = await env.client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history()
            (OUT / f"{prefix}softmax_run{i + 1}.json").write_text(hist.to_json())
        child = [w async for w in env.client.list_workflows("WorkflowType = 'EvaluateCandidate'")
                 if w.id.startswith("replay-fixture-eval-1-")]
        hist = await env.client.get_workflow_handle(child[0].id, run_id=child[0].run_id).fetch_history()
        (OUT / f"{prefix}softmax_evaluation.json").write_text(hist.to_json())
        print(f"wrote {len(runs) + 1} histories to {OUT}")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    import sys

    # a prefix for the fixtures of a patched change, recorded beside today's
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else ""))
