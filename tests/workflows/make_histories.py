"""Record the replay fixtures in tests/histories/ with today's code:
`python -m tests.workflows.make_histories [PREFIX] [--policy search|llm]`.

Records one run of every kind of history the workflow makes: a run that ends in continue-as-new after
a compaction with evaluations under way (their results arrive in the next run), with a signal, an accepted
and a rejected budget update, a pause and resume; the final run that completes; and one evaluation's
child workflow. With `--policy llm` (files `PREFIXllm_softmax_*`) the same run is driven by a scripted
model over HTTP (tests/llm/server.py): its turns, tool calls, a call that fails the same way until it is
answered without running and the turn narrowed to submit_kernel, the notebook's compactions; its
evaluations report as a GPU's, so a new best's answer brings its profile and a slower one's does not, and
a new best's evaluation with its best-only checks is kept too (`PREFIXllm_softmax_evaluation_best.json`).
An evaluation told it is the run's front while under way is kept where there is one
(`PREFIXsoftmax_evaluation_front.json`).
A change that alters the command sequence of a supported version goes behind `workflow.patched`, and its
fixtures are recorded beside these (docs/architecture.md, Versioning)."""

from __future__ import annotations

import asyncio
import json
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


def llm_script():
    """The scripted model's turns: reads, a broken submission, a call failing the same way three times
    (the third answered without running; the next turn offers only submit_kernel), then submissions that
    improve, each after the model's own compile and profile calls, and a slower one last."""
    from tests.llm.kernels import LADDER, softmax_kernel
    from tests.llm.script import TurnScript, turn

    def submit(i: int):
        return ("submit_kernel", {"source": softmax_kernel(**LADDER[i]), "rationale": f"ladder step {i}"})

    broken = ("submit_kernel", {"source": softmax_kernel(**LADDER[0]).replace("def run(", "def run(:\n", 1),
                                "rationale": "first try"})
    items = [turn(("read_baseline", {}), ("read_starting_kernel", {})), turn(broken)]
    items += [turn(("compile", {})) for _ in range(3)] + [turn(submit(0))]
    for i in range(1, 8):
        src = softmax_kernel(**LADDER[i])
        items.append(turn(("compile", {"source": src}), ("profile", {"source": src}), submit(i)))
    # slower than the best: passed, its answer brings no profile (profile-new-bests-only)
    items.append(turn(("submit_kernel", {"source": softmax_kernel(BLOCK_N=64, num_warps=2), "rationale": "wider"})))
    return TurnScript(items)


async def main(prefix: str, policy: str = "search") -> None:
    os.environ["MARATHON_ARTIFACTS"] = tempfile.mkdtemp()
    env = await WorkflowEnvironment.start_local(data_converter=pydantic_data_converter,
                                                dev_server_existing_path=temporal_path(),
                                                search_attributes=SEARCH_ATTRIBUTES,
                                                dev_server_extra_args=dev_server_config_args())
    from tests import evaluators

    # every third candidate compiles slowly, so the rolling population really overlaps and some evaluations
    # are still under way at a compaction
    evaluators.SLOW_EVERY, evaluators.SLOW_S = 3, 0.5
    # the llm run's reports read as a GPU's: a new best's answer brings its profile, a slower one's does not
    evaluators.INTERPRETER = policy != "llm"
    server = None
    if policy == "llm":
        from tests.llm.server import ChatServer

        server = ChatServer(llm_script()).__enter__()
        os.environ.update(OPENAI_BASE_URL=server.url, OPENAI_API_KEY="fixture-key", MARATHON_MODEL="scripted-model",
                          MARATHON_LLM_TIMEOUT="5", MARATHON_PRICE_IN="1.0", MARATHON_PRICE_OUT="4.0")
        prefix += "llm_"
    wid = "replay-fixture"  # the id the fixtures replay under (tests/workflows/test_replay.py)
    try:
        async with workers(env.client):
            spec = RunSpec(problem="softmax", budget={"iterations": 8}, compact_every=4, population=2) \
                if policy == "search" else RunSpec(problem="softmax", policy="llm", budget={"iterations": 8},
                                                   compact_every=4)
            h = await env.client.start_workflow(KernelOptimization.run, spec, id=wid, task_queue=AGENT_QUEUE)
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
        runs = [w async for w in env.client.list_workflows(f"WorkflowId = '{wid}'")]
        OUT.mkdir(exist_ok=True)
        for i, w in enumerate(sorted(runs, key=lambda w: w.start_time)):
            hist = await env.client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history()
            (OUT / f"{prefix}softmax_run{i + 1}.json").write_text(hist.to_json())
        child = [w async for w in env.client.list_workflows("WorkflowType = 'EvaluateCandidate'")
                 if w.id.startswith(f"{wid}-eval-1-")]
        hist = await env.client.get_workflow_handle(child[0].id, run_id=child[0].run_id).fetch_history()
        (OUT / f"{prefix}softmax_evaluation.json").write_text(hist.to_json())
        written = len(runs) + 1
        for w in [w async for w in env.client.list_workflows("WorkflowType = 'EvaluateCandidate'")]:
            text = (await env.client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history()).to_json()
            if '"signalName":"front"' in text.replace(" ", ""):  # told it is the front while under way
                (OUT / f"{prefix}softmax_evaluation_front.json").write_text(text)
                written += 1
                break
        if policy == "llm":  # also a new best's evaluation with its best-only checks (the first has none)
            for w in sorted([w async for w in env.client.list_workflows("WorkflowType = 'EvaluateCandidate'")],
                            key=lambda w: w.start_time):
                text = (await env.client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history()).to_json()
                benches = [e for e in json.loads(text)["events"] if e.get(
                    "activityTaskScheduledEventAttributes", {}).get("activityType", {}).get("name")
                    == "benchmark_candidate"]
                if len(benches) >= 2:  # the benchmark and the fresh-process re-measure
                    (OUT / f"{prefix}softmax_evaluation_best.json").write_text(text)
                    written += 1
                    break
        print(f"wrote {written} histories to {OUT}")
    finally:
        if server is not None:
            server.__exit__(None, None, None)
        await env.shutdown()


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", nargs="?", default="", help="names the fixtures of a patched change, beside today's")
    ap.add_argument("--policy", choices=("search", "llm"), default="search")
    args = ap.parse_args()
    asyncio.run(main(args.prefix, args.policy))
