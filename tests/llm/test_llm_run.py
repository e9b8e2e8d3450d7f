"""Policy llm end to end: the real openai client against a scripted Chat Completions server, the real
Temporal dev server, the agent worker and the synthetic GPU evaluator."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from activities.ledger import read_ledger
from activities.search import candidate_id
from tests.llm.kernels import LADDER, MARKER, softmax_kernel
from tests.llm.script import TurnScript, turn
from tests.llm.server import ChatServer, prompt_text
from tests.workflows.helpers import assert_contiguous, start, until, workers
from workflows.contracts import AGENT_QUEUE, RunSpec
from workflows.optimization import KernelOptimization


async def history_text(handle) -> str:
    """The current run's history as text, with every payload decoded (they are base64 in JSON)."""
    hist = json.loads((await handle.fetch_history()).to_json())
    out = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "data" and isinstance(v, str):
                    out.append(base64.b64decode(v).decode(errors="replace"))
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(hist)
    return "\n".join(out)


def improving_script() -> list:
    items = [turn(("read_baseline", {}), ("read_oracle", {}), ("read_starting_kernel", {}))]
    prev = None
    for i, knobs in enumerate(LADDER):
        src = softmax_kernel(**knobs)
        items.append(turn(("compile", {"source": src}), ("check", {"source": src}),
                          ("benchmark", {"source": src})))
        calls = [("profile", {"source": src}),
                 ("submit_kernel", {"source": src, "rationale": f"ladder step {i}: {knobs}"})]
        if i % 4 == 3:
            calls += [("show_best", {}), ("diff_against_best", {"candidate_id": prev}), ("read_notebook", {})]
        items.append(turn(*calls))
        prev = candidate_id(src)
    return items


@pytest.mark.slow
async def test_llm_run_improves_across_turns_with_compaction_and_can(env, store, llm_env):
    script = TurnScript(improving_script())
    with ChatServer(script) as server:
        llm_env(server)
        spec = RunSpec(problem="softmax", policy="llm", budget={"iterations": len(LADDER)}, compact_every=3)
        async with workers(env.client):
            h = await start(env.client, spec, "llm-run")
            res = await h.result()
            st = await h.query(KernelOptimization.status)
            hist = await history_text(h)
            meta = await h.query("__temporal_workflow_metadata")
        turns, compactions = server.turns(), server.compactions()

    assert res.stopped_by == "budget-iterations"
    assert_contiguous(store, res, len(LADDER))
    assert res.runs == 4  # continue-as-new after the compactions at 3, 6 and 9 submissions
    recs = read_ledger(store, res.ledger_key)
    assert [r.rationale for r in recs] == [f"ladder step {i}: {k}" for i, k in enumerate(LADDER)]
    # it improved across turns: the best is the fastest rung, far above the first kernel
    assert res.best.candidate_id == candidate_id(softmax_kernel(**LADDER[10]))
    assert res.best.time_ms * 3 < recs[0].time_ms  # (interpreter timings: a result carries no speedup)
    assert sum(r.outcome == "improved" for r in recs) >= 5

    # accounting adds up: every token the server reported, every tool call it asked for
    assert all(s.status == 200 for s in turns)
    n_calls = 3 + 5 * len(LADDER) + 3 * (len(LADDER) // 4)
    assert res.used.tool_calls == n_calls >= 50
    assert res.used.turns == len(turns) == 1 + 2 * len(LADDER)
    tin, tout = server.usage_total()
    assert (res.used.tokens_in, res.used.tokens_out) == (tin, tout)
    assert len(server.probes()) == 2  # whether the tools' answers reach the model: once, and they do
    t_in, t_out = server.usage_total(turns + server.probes())
    assert abs(res.used.cost_usd - (t_in * 1.0 + t_out * 4.0) / 1e6) < 1e-9
    assert st.used == res.used
    details = meta.current_details if hasattr(meta, "current_details") else meta["currentDetails"]
    assert f"{res.used.turns} model turns, {n_calls} tool calls" in details  # the Web UI shows the totals
    assert len(compactions) == 4  # three before continue-as-new, one at the end

    # every turn restates the goal; the best appears once there is one
    first_best = None
    for s in turns:
        text = prompt_text(s)
        assert "# Objective" in text and "Remaining budget" in text and "Rules: Triton only" in text
        if first_best:
            assert "Current best: " in text and "none yet" not in text.split("Current best:")[1][:20]
        if "Current best: none yet" not in text:
            first_best = True
    # the model's notebook is used by later prompts; the conversation and answers cross continue-as-new
    after_first = [prompt_text(s) for s in turns if s.at > compactions[0].at]
    assert after_first and all("NOTEBOOK-MARK-" in t for t in after_first)
    assert any("NOTEBOOK-MARK-3" in t for t in after_first)
    for s in turns[1:]:
        roles = [m["role"] for m in s.body["messages"]]
        assert "assistant" in roles and "tool" in roles
        ids = {c["id"] for m in s.body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])}
        answered = {m["tool_call_id"] for m in s.body["messages"] if m["role"] == "tool"}
        assert ids == answered
    notebook = store.get_text(res.notebook_key)
    assert notebook.startswith("# Notebook: softmax, version 4") and "NOTEBOOK-MARK-4" in notebook
    # claim check: kernel sources and the key never enter workflow history
    assert "ladder step 11" in hist  # payloads were decoded: the last rationale is there
    assert MARKER not in hist and "test-key-0123" not in hist
    # tool answers reached the model: a compile report, a benchmark, a recorded iteration
    joined = "\n".join(m["content"] for s in turns for m in s.body["messages"] if m["role"] == "tool")
    assert "compiled" in joined and "ran under the interpreter; under the Triton interpreter no speed" in joined
    assert "iteration 12:" not in joined
    assert "iteration 11: passed verification" in joined  # (interpreter timings: no speed told)
    # nowhere a ratio of interpreter timings: not in a tool's answer (the benchmark, show_best), not in a prompt
    import re

    assert "Best: " in joined and not re.search(r"\d\.\d{3}x", joined), re.findall(r".{60}\d\.\d{3}x", joined)
    assert not any(re.search(r"\d\.\d{3}x", prompt_text(s)) for s in turns)


async def test_worker_restart_mid_run_loses_nothing(env, store, llm_env):
    """Every workflow task replays the whole history (no cache), and the agent worker is stopped and
    replaced mid-run: the run goes on from where it was, nothing recorded twice or lost."""
    from concurrent.futures import ThreadPoolExecutor

    from temporalio.worker import Worker

    from activities.worker import WORKFLOWS, agent_activities
    from tests.evaluators import SYNTHETIC_GPU_ACTIVITIES
    from workflows.contracts import GPU_QUEUE

    def slow(*calls):
        def f(body):
            r = turn(*calls)(body)
            r.delay = 0.15
            return r
        return f

    items = []
    for i in range(8):
        src = softmax_kernel(**LADDER[i])
        items += [slow(("compile", {"source": src}), ("read_notebook", {})),
                  slow(("submit_kernel", {"source": src, "rationale": f"step {i}"}))]
    script = TurnScript(items)

    def pair(client):
        agent = Worker(client, task_queue=AGENT_QUEUE, workflows=WORKFLOWS, activities=agent_activities(),
                       activity_executor=ThreadPoolExecutor(8), max_concurrent_activities=8, max_cached_workflows=0)
        gpu = Worker(client, task_queue=GPU_QUEUE, activities=SYNTHETIC_GPU_ACTIVITIES,
                     activity_executor=ThreadPoolExecutor(4), max_concurrent_activities=4)
        return agent, gpu

    with ChatServer(script) as server:
        llm_env(server)
        agent, gpu = pair(env.client)
        async with agent, gpu:
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 5},
                                                compact_every=3), "llm-crash")
            await until(lambda s: s.iteration >= 2, h)
        await asyncio.sleep(0.5)  # no worker at all for a while
        agent, gpu = pair(env.client)
        async with agent, gpu:
            res = await h.result()
        turns = server.turns()
    assert res.stopped_by == "budget-iterations" and res.runs == 2
    # the llm patches are decided in the run's first task, before any local activity (replays under load
    # once met a patch marker recorded after a local activity's before the code that makes it)
    markers = [(e.marker_recorded_event_attributes.marker_name,
                b"".join(p.data for ps in e.marker_recorded_event_attributes.details.values() for p in ps.payloads))
               async for e in env.client.get_workflow_handle(h.id).fetch_history_events()
               if e.HasField("marker_recorded_event_attributes")]
    at_start = next(i for i, (_, d) in enumerate(markers) if b"llm-patches-at-start" in d)
    assert all(name != "core_local_activity" for name, _ in markers[:at_start])
    assert not any(b"llm-progress" in d for _, d in markers)  # the per-turn patch is never recorded now
    assert_contiguous(store, res, 5)
    recs = read_ledger(store, res.ledger_key)
    assert len({r.candidate_id for r in recs}) == 5
    for s in turns[1:]:
        ids = {c["id"] for m in s.body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])}
        answered = {m["tool_call_id"] for m in s.body["messages"] if m["role"] == "tool"}
        assert ids == answered and ids
