"""Policy llm, whole runs on the Temporal dev server: a looping model is stopped by the turn budget,
duplicates are caught across continue-as-new, an endpoint without tools runs in text mode with the
adaptation kept for the run, a context too small pauses naming context_tokens, hints stay in force until
cleared, timed kernels bring their profile on a GPU, a new best's taken beside its own checks."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time

import pytest
from temporalio import activity
from temporalio.client import WorkflowUpdateFailedError

from activities.ledger import read_ledger
from activities.search import candidate_id
from tests.llm.kernels import LADDER, softmax_kernel
from tests.llm.script import TurnScript, prompt_tokens, turn
from tests.llm.server import ChatServer, Endpoint, Kind, completion, prompt_text
from tests.workflows.helpers import start, until, workers
from tests import evaluators as synthetic
from workflows.contracts import BenchReport, BenchRequest, EvalRequest, ProfileReport, RunSpec
from workflows.optimization import KernelOptimization


NO_SPEED = "under the Triton interpreter no speed is measured (speedups come from a GPU)"


def submit(i: int):
    return ("submit_kernel", {"source": softmax_kernel(**LADDER[i]), "rationale": f"step {i}"})


def tool_answers(seen) -> list[str]:
    """The answers to the latest turn a prompt replays: the tool messages after its last assistant message."""
    msgs = seen.body["messages"]
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    return [m["content"] for m in msgs[last + 1:] if m["role"] == "tool"]


async def test_a_model_repeating_one_submission_is_stopped_by_the_turn_budget(env, store, llm_env):
    script = TurnScript([turn(submit(0))] + [turn(submit(0), ("read_baseline", {})) for _ in range(50)])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 10},
                                                turns_per_iteration=4), "llm-loop")
            res = await h.result()
        turns = server.turns()
    assert res.stopped_by == "turn-budget" and res.iterations == 1
    assert res.stop_reason == "no new iteration recorded in 4 model turns (turns_per_iteration 4)"
    assert res.used.turns == len(turns) == 1 + 4  # the submission, then 4 turns with nothing new
    assert all("already evaluated as iteration 1" in tool_answers(s)[0] for s in turns[2:])
    assert any("turns left to record a new submission" in s.body["messages"][-1]["content"] for s in turns)


async def test_duplicates_are_caught_across_continue_as_new(env, store, llm_env):
    script = TurnScript([turn(submit(0)), turn(submit(0)), turn(submit(1))])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 2},
                                                compact_every=1), "llm-dup")
            res = await h.result()
        turns = server.turns()
    recs = read_ledger(store, res.ledger_key)
    assert [r.candidate_id for r in recs] == [candidate_id(softmax_kernel(**LADDER[i])) for i in (0, 1)]
    assert res.runs >= 2  # the repeat came in the run after the compaction
    (dup,) = tool_answers(turns[2])
    assert "already evaluated: iteration 1" in dup and "Change something" in dup


async def test_endpoint_without_tools_runs_in_text_mode_adapted_once(env, store, llm_env):
    def text_turn(i):
        src = softmax_kernel(**LADDER[i])
        return lambda body: completion(f"Checking step {i}.\nTOOL: check\n```python\n{src}```\n"
                                       f"TOOL: submit_kernel rationale=\"rung {i}\"\n```python\n{src}```\n",
                                       prompt_tokens=prompt_tokens(body))

    script = TurnScript([text_turn(0), text_turn(4), text_turn(7)])
    endpoint = Endpoint("ollama", script)
    with ChatServer(endpoint) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 3},
                                                compact_every=2), "llm-text")
            res = await h.result()
        turns = server.turns()
    assert res.stopped_by == "budget-iterations" and res.runs == 2
    recs = read_ledger(store, res.ledger_key)
    assert [r.rationale for r in recs] == ["rung 0", "rung 4", "rung 7"]
    assert [s.status for s in turns] == [400, 200, 200, 200]  # refused once, then text mode for the run
    assert len(endpoint.refused) == 1 and "does not support tools" in endpoint.refused[0]
    later = turns[2].body["messages"]  # turn 2: the answers to turn 1
    assert not any(m["role"] == "tool" for m in later)
    results = later[-2]["content"] if later[-2]["role"] == "user" else later[-1]["content"]
    assert "## Result of check (call 1)" in results and "## Result of submit_kernel (call 2)" in results
    assert "iteration 1:" in results


async def test_a_context_too_small_pauses_naming_context_tokens(env, store, llm_env):
    script = TurnScript([turn(submit(2))])
    endpoint = Endpoint("small-context", script)
    endpoint.rules = Kind(context=1200, context_error="openai")
    with ChatServer(endpoint) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 1}),
                            "llm-ctx")
            st = await until(lambda s: s.phase == "paused", h, timeout=30)
            assert "context of 1200 tokens" in st.pause_reason and "a context of at least" in st.pause_reason
            assert st.used.turns == 0
            with pytest.raises(WorkflowUpdateFailedError):
                await h.execute_update(KernelOptimization.set_context_tokens, 10)
            cli = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cli", "budget", h.id, "--context-tokens", "12000",
                "--address", env.client.service_client.config.target_host,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await cli.communicate()
            assert cli.returncode == 0 and out.decode().strip() == "context_tokens now 12000", err.decode()
            endpoint.rules = Kind(context=32000)  # the operator gives the server a larger context
            await h.signal(KernelOptimization.resume)
            res = await h.result()
    assert res.iterations == 1 and res.stopped_by == "budget-iterations"
    assert server.turns()[-1].status == 200 and len(server.turns()) == 2  # refused once, then it fit


def test_the_turn_budget_flag_reaches_the_spec():
    from cli.parser import build_parser
    from cli.spec import parse_spec

    args = build_parser().parse_args(["start", "softmax", "--policy", "llm", "--turns-per-iteration", "7"])
    assert parse_spec(args).turns_per_iteration == 7
    assert RunSpec(problem="softmax").turns_per_iteration == 30
    with pytest.raises(ValueError, match="turns_per_iteration must be at least 1"):
        RunSpec(problem="softmax", turns_per_iteration=0)


async def test_hints_stay_until_cleared_and_reach_the_notebook(env, store, llm_env):
    import re

    from workflows.contracts import Hint

    hint = "HINT-9: keep two rows per program"

    def slow(*calls):
        def f(body):
            r = turn(*calls)(body)
            r.delay = 0.25
            return r
        return f

    script = TurnScript([slow(("read_notebook", {})) for _ in range(7)] + [slow(submit(0))]
                        + [slow(("read_notebook", {})) for _ in range(5)] + [slow(submit(1))])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 2},
                                                compact_every=1), "llm-hints")
            await h.signal(KernelOptimization.hint, Hint(text=hint))
            while len(server.turns()) < 10:
                await asyncio.sleep(0.02)
            await h.signal(KernelOptimization.clear_hints)
            cleared_at = len(server.turns())
            res = await h.result()
        turns = server.turns()
    assert res.iterations == 2
    shown = [hint in s.body["messages"][-1]["content"] for s in turns]  # the turn's state message
    first = shown.index(True)
    assert first <= 1 and all(shown[first:10])  # in force for 9+ turns, past the 4 replayed turns
    assert not any(shown[cleared_at + 1:])  # gone once cleared
    assert all(hint in prompt_text(s) for s in turns[first:10])
    final = store.get_text(res.notebook_key)
    assert hint not in final
    first_version = store.get_text(re.search(r"previous version: (\w+)", final).group(1))
    assert f"## Operator hints in force\n- {hint}" in first_version


# the synthetic evaluator as a GPU would answer: device timings, and a profiler summary
@activity.defn(name="benchmark_candidate")
def gpu_benchmark(req: BenchRequest) -> BenchReport:
    return synthetic.benchmark_candidate(req).model_copy(update={"interpreter": False})


@activity.defn(name="profile_candidate")
def gpu_profile(req: EvalRequest) -> ProfileReport:
    return ProfileReport(ok=True, bound="memory", tool="ncu",
                         summary=f"PROFILE-OF-{req.candidate_id}: 2.1 of 4.8 TB/s, occupancy 38%, 96 registers")


async def test_timed_kernels_bring_their_profile_on_a_gpu(env, store, llm_env):
    src0, src1 = softmax_kernel(**LADDER[0]), softmax_kernel(**LADDER[1])
    script = TurnScript([turn(("benchmark", {"source": src0})), turn(submit(1)), turn(submit(0)), turn(submit(2))])
    gpu = [synthetic.compile_candidate, synthetic.verify_candidate, gpu_benchmark, gpu_profile]
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client, gpu):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 3}), "llm-prof")
            res = await h.result()
        turns, compactions = server.turns(), server.compactions()
    assert res.iterations == 3
    (bench,) = tool_answers(turns[1])
    assert f"PROFILE-OF-{candidate_id(src0)}" in bench and "(ncu, memory-bound)" in bench
    (submitted,) = tool_answers(turns[2])
    assert submitted.startswith("iteration 1: improved") and f"PROFILE-OF-{candidate_id(src1)}" in submitted
    assert re.search(r"improved: \d+\.\d{3}x .*, [\d.]+ ms vs baseline [\d.]+ ms", submitted), submitted
    assert f"current best: {candidate_id(src1)} " in submitted and NO_SPEED not in submitted
    # a submission that crowns nothing gets its verdict without waiting for a profile, and says how to ask
    (slower,) = tool_answers(turns[3])
    assert slower.startswith("iteration 2: passed") and "PROFILE-OF-" not in slower, slower
    assert f"call `profile` with candidate_id {candidate_id(src0)}" in slower
    # the notebook's rewrite is given what the tools said, not only the submissions
    summary = prompt_text(compactions[-1])
    assert f"- turn 1 benchmark {candidate_id(src0)}: " in summary and f"PROFILE-OF-{candidate_id(src0)}" in summary


async def test_a_submission_under_the_interpreter_is_told_it_passed_and_that_no_speed_is_measured(env, store, llm_env):
    # the synthetic evaluator answers as the interpreter does: a kernel's time and the baseline's (torch on
    # the CPU) say nothing about speed
    script = TurnScript([turn(submit(0)), turn(submit(4)), turn(submit(4)), turn(submit(7))])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 3}),
                            "llm-interp-answers")
            res = await h.result()
        turns = server.turns()
    recs = read_ledger(store, res.ledger_key)
    assert all(r.interpreter and r.speedup is not None for r in recs)  # the record keeps its ratio
    first, second, again = (tool_answers(s)[0] for s in turns[1:4])
    assert first == (f"iteration 1: passed verification (rel err {recs[0].rel_err:.2g}); {NO_SPEED}. "
                     f"current best: {recs[0].candidate_id} (iteration 1)."), first
    assert second.startswith("iteration 2: passed verification") and "already evaluated" in again
    for answer in (first, second, again):
        assert NO_SPEED in answer and "vs baseline" not in answer, answer
        assert not re.search(r"\d\.\d{3}x|\d ms", answer), answer


BESIDE: dict = {}  # (iteration, "verify" | "profile") -> threading.Event: that check has begun
PROFILED: list[tuple[int, str, bool]] = []  # (iteration, workflow id, whether the other-shape check was under way)
FRESH_SLOWER = 3  # the iteration whose fresh-process re-measure does not confirm it


def _begun(iteration: int, what: str) -> threading.Event:
    return BESIDE.setdefault((iteration, what), threading.Event())


@activity.defn(name="verify_candidate")
def beside_verify(req: EvalRequest):
    if req.random_shape:  # a crowned candidate's check: under way while its profile is
        _begun(req.iteration, "verify").set()
        _begun(req.iteration, "profile").wait(10)
    return synthetic.verify_candidate(req).model_copy(update={"interpreter": False})


@activity.defn(name="benchmark_candidate")
def beside_benchmark(req: BenchRequest) -> BenchReport:
    rep = synthetic.benchmark_candidate(req)
    upd: dict = {"interpreter": False}
    if req.best is not None:
        r = req.best.time_ms / rep.time_ms
        if req.fresh_process and req.iteration == FRESH_SLOWER:
            r = 0.5
        upd.update(time_ms=req.best.time_ms / r, vs_best=req.best.candidate_id, vs_best_ci=(r * 0.99, r * 1.01),
                   best_time_ms=req.best.time_ms)
    return rep.model_copy(update=upd)


@activity.defn(name="profile_candidate")
def beside_profile(req: EvalRequest) -> ProfileReport:
    _begun(req.iteration, "profile").set()
    PROFILED.append((req.iteration, activity.info().workflow_id, _begun(req.iteration, "verify").wait(10)))
    if req.iteration == FRESH_SLOWER:  # a profile nobody will read: it runs on until the test ends
        end = time.monotonic() + 60
        while not _begun(0, "test over").is_set() and time.monotonic() < end:
            activity.heartbeat()
            time.sleep(0.1)
        _begun(req.iteration, "profile over").set()
    return gpu_profile(req)


async def test_a_new_best_s_profile_is_taken_beside_its_checks(env, store, llm_env):
    """A submission that crowns a new best is answered with its profile, taken by the evaluation beside the
    best-only checks (its verification at another shape, its fresh re-measure) instead of after them; one
    whose re-measure does not confirm it is answered as passed at once, with no profile, its profile cancelled."""
    from temporalio.api.enums.v1 import EventType

    BESIDE.clear()
    PROFILED.clear()
    script = TurnScript([turn(submit(1)), turn(submit(2)), turn(submit(3)), turn(submit(0))])
    gpu = [synthetic.compile_candidate, beside_verify, beside_benchmark, beside_profile]
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client, gpu):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 4}),
                            "llm-prof-beside")
            res = await h.result()
            unread = [wid for i, wid, _ in PROFILED if i == FRESH_SLOWER]
            # the unread profile still runs: the verdicts did not wait for it, and its evaluation cancelled it
            running = not _begun(FRESH_SLOWER, "profile over").is_set()
            history = [e async for e in env.client.get_workflow_handle(unread[0]).fetch_history_events()]
            _begun(0, "test over").set()
        turns = server.turns()
    assert res.iterations == 4
    answers = [tool_answers(t)[0] for t in turns[1:4]]
    for i, answer in enumerate(answers[:2], start=1):
        assert answer.startswith(f"iteration {i}: improved"), answer
        assert f"PROFILE-OF-{candidate_id(softmax_kernel(**LADDER[i]))}" in answer, answer
    assert answers[2].startswith("iteration 3: passed") and "PROFILE-OF-" not in answers[2], answers[2]
    # each crowned candidate's profile once, in its evaluation's workflow, while its other-shape check ran
    taken = [(i, "-eval-" in wid, beside) for i, wid, beside in PROFILED if i != FRESH_SLOWER]
    assert taken == [(1, True, True), (2, True, True)], PROFILED
    assert len(unread) == 1 and running
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED in [e.event_type for e in history]
