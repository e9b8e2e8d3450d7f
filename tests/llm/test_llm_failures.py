"""Policy llm when the endpoint or the model misbehaves: rate limits, server errors and timeouts, bad
credentials and unknown models, malformed output, a failing compaction; hints and the token budget."""

from __future__ import annotations

import asyncio
import io
import time

from activities.ledger import read_ledger
from activities.search import candidate_id
from cli.query import watch
from tests.llm.kernels import LADDER, softmax_kernel
from tests.llm.script import TurnScript, prompt_tokens, turn
from tests.llm.server import ChatServer, completion, error, prompt_text
from tests.llm.test_llm_run import history_text
from tests.workflows.helpers import start, until
from tests.workflows.helpers import assert_contiguous, workers
from workflows.contracts import Hint, RunSpec
from workflows.optimization import KernelOptimization


def submit(i: int, why: str = "step"):
    return ("submit_kernel", {"source": softmax_kernel(**LADDER[i]), "rationale": f"{why} {i}"})


def spec(n: int, **kw) -> RunSpec:
    return RunSpec(problem="softmax", policy="llm", budget={"iterations": n}, **kw)


async def test_rate_limit_storm_waits_as_told_and_never_pauses(env, store, llm_env):
    storm = [error(429, "Rate limit reached for requests", retry_after=1) for _ in range(4)]
    script = TurnScript(storm + [turn(submit(0)), turn(submit(5))])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, spec(2), "llm-429")
            res = await h.result()
            hist = await history_text(h)
        turns = server.turns()
    assert res.stopped_by == "budget-iterations" and res.iterations == 2
    assert [s.status for s in turns] == [429] * 4 + [200, 200]
    gaps = [b.at - a.at for a, b in zip(turns, turns[1:5])]
    assert all(g >= 0.9 for g in gaps), gaps  # Retry-After: 1 honoured on every retry
    assert res.used.turns == 2 and (res.used.tokens_in, res.used.tokens_out) == server.usage_total()
    assert '"paused"' not in hist  # the phase never went to paused


async def test_server_errors_and_slow_replies_are_retried_with_backoff(env, store, llm_env):
    slow = completion(None, [submit(2)], prompt_tokens=999, completion_tokens=99)
    slow.delay = 2.5  # longer than the client's timeout: the reply never arrives
    script = TurnScript([error(503, "upstream overloaded"), error(500, "internal"), slow, turn(submit(3))])
    with ChatServer(script) as server:
        llm_env(server, timeout=1.0)
        async with workers(env.client):
            h = await start(env.client, spec(1), "llm-5xx")
            res = await h.result()
            st = await h.query(KernelOptimization.status)
        turns = server.turns()
    assert [s.status for s in turns] == [503, 500, 200, 200]
    assert turns[2].at - turns[1].at >= 1.5  # exponential backoff: 1 s, then 2 s
    recs = read_ledger(store, res.ledger_key)
    assert [r.candidate_id for r in recs] == [candidate_id(softmax_kernel(**LADDER[3]))]
    # only the reply the client received counts: not the one it timed out on
    assert res.used.turns == 1
    assert (res.used.tokens_in, res.used.tokens_out) == server.usage_total([turns[3]] + server.compactions())
    assert not st.paused


async def test_bad_key_pauses_the_run_and_resume_retries_the_turn(env, store, llm_env):
    good = "good-key-XYZ789"

    def respond(body, headers):
        if headers.get("authorization") != f"Bearer {good}":
            key = headers.get("authorization", "").removeprefix("Bearer ")
            return error(401, f"Incorrect API key provided: {key}. You can find your API key in your account.",
                         code="invalid_api_key")
        return script(body, headers)

    script = TurnScript([turn(submit(4))])
    with ChatServer(respond) as server:
        mp = llm_env(server, key="bad-key-SECRET1")
        async with workers(env.client):
            h = await start(env.client, spec(1), "llm-401")
            shown = io.StringIO()
            watching = asyncio.create_task(watch(env.client, h.id, interval=0.1, out=shown))
            st = await until(lambda s: s.phase == "paused", h, timeout=30)
            assert st.paused and "401" in st.pause_reason and "authentication" in st.pause_reason
            assert "OPENAI_API_KEY" in st.pause_reason and "resume" in st.pause_reason
            assert "bad-key-SECRET1" not in st.pause_reason
            await asyncio.sleep(1.5)
            assert [s.status for s in server.turns()] == [401]  # not retried: no budget burnt
            assert (await h.query(KernelOptimization.status)).used.turns == 0
        mp.setenv("OPENAI_API_KEY", good)  # the operator fixes the worker's configuration and restarts it
        async with workers(env.client):
            await h.signal(KernelOptimization.resume)
            res = await h.result()
            hist = await history_text(h)
            await watching
        statuses = [s.status for s in server.turns()]
    # the live view says why the run paused and what goes on
    (said,) = [ln for ln in shown.getvalue().splitlines() if ln.startswith("      paused: ")]
    assert "401" in said and "OPENAI_API_KEY" in said and f"`marathon resume {h.id}` goes on" in said, said
    assert res.stopped_by == "budget-iterations" and res.iterations == 1
    assert statuses == [401, 200]
    assert res.used.turns == 1
    assert "bad-key-SECRET1" not in hist and good not in hist
    assert '"paused"' in hist  # (the check the 429 test relies on does see a pause)


async def test_unknown_model_pauses_until_fixed(env, store, llm_env):
    def respond(body, headers):
        if body.get("model") != "scripted-model":
            return error(404, f"The model `{body.get('model')}` does not exist", code="model_not_found")
        return script(body, headers)

    script = TurnScript([turn(submit(1))])
    with ChatServer(respond) as server:
        mp = llm_env(server, model="no-such-model")
        async with workers(env.client):
            h = await start(env.client, spec(1), "llm-404")
            st = await until(lambda s: s.phase == "paused", h, timeout=30)
            assert "404" in st.pause_reason and "no-such-model" in st.pause_reason
        mp.setenv("MARATHON_MODEL", "scripted-model")  # fixed, and the worker restarted
        async with workers(env.client):
            await h.signal(KernelOptimization.resume)
            res = await h.result()
    assert res.iterations == 1 and [s.status for s in server.turns()] == [404, 200]


async def test_malformed_output_is_fed_back_and_failed_compaction_falls_back(env, store, llm_env):
    src0, src3 = softmax_kernel(**LADDER[0]), softmax_kernel(**LADDER[3])

    def bad_json(body):
        r = completion(None, [("submit_kernel", '{"source": "import triton\n'), ("rm_rf", {"path": "/"}),
                              ("compile", {}), ("submit_kernel", {"rationale": "forgot the source"})],
                       prompt_tokens=prompt_tokens(body))
        return r

    script = TurnScript([
        bad_json,
        turn(content=f"Here is a kernel.\n```python\n{src0}```\nIt should be fine."),
        turn(content="Let me think about what to do next."),
        turn(("submit_kernel", {"source": f"```python\n{src3}```", "rationale": "fenced source"})),
    ], compaction=lambda body: error(500, "compaction backend down"))
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, spec(2, compact_every=1), "llm-bad")
            res = await h.result()
        turns = server.turns()
    assert res.stopped_by == "budget-iterations"
    assert_contiguous(store, res, 2)
    recs = read_ledger(store, res.ledger_key)
    assert recs[0].candidate_id == candidate_id(src0) and "without a tool call" in recs[0].rationale
    assert recs[1].candidate_id == candidate_id(src3) and recs[1].rationale == "fenced source"
    tool_answers = [m["content"] for m in turns[1].body["messages"] if m["role"] == "tool"]
    assert len(tool_answers) == 4
    assert "not valid JSON" in tool_answers[0] and "unknown tool 'rm_rf'" in tool_answers[1]
    assert "needs `source`" in tool_answers[2] and "needs `source`" in tool_answers[3]
    # the implicit submission is answered as a user message (it had no tool call id)
    last_user = [m["content"] for m in turns[2].body["messages"] if m["role"] == "user"]
    assert any("iteration 1:" in t for t in last_user)
    assert any("no tool call and no kernel code" in t for t in
               (m["content"] for m in turns[3].body["messages"] if m["role"] == "user"))
    assert res.used.tool_calls == 4 + 1 + 0 + 1 and res.used.turns == 4
    # both compactions failed at the endpoint: the deterministic notebook was written instead
    notebook = store.get_text(res.notebook_key)
    assert notebook.startswith("# Notebook: softmax, version 2") and "did not rewrite" in notebook
    assert res.used.tokens_in == server.usage_total()[0]


async def test_hint_reaches_the_next_prompt(env, store, llm_env):
    hint = "HINT-42: try VARIANT=single with BLOCK_N=1024"

    def slow(calls):
        def f(body):
            r = completion(None, calls, prompt_tokens=prompt_tokens(body))
            r.delay = 0.3
            return r
        return f

    script = TurnScript([slow([("read_notebook", {})]) for _ in range(3)] + [slow([submit(9)])])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, spec(1), "llm-hint")
            while len(server.turns()) < 2:
                await asyncio.sleep(0.02)
            sent_at = time.monotonic()
            await h.signal(KernelOptimization.hint, Hint(text=hint))
            res = await h.result()
            st = await h.query(KernelOptimization.status)
        turns = server.turns()
    assert res.iterations == 1 and st.pending_hints == 0
    before = [s for s in turns if s.at < sent_at]
    after = [s for s in turns if s.at >= sent_at]
    assert before and all(hint not in prompt_text(s) for s in before)
    fresh = [i for i, s in enumerate(after) if "New hints from the operator" in prompt_text(s) and hint in prompt_text(s)]
    assert len(fresh) == 1 and fresh[0] <= 1  # shown as new exactly once, in the next turn
    assert all(hint in prompt_text(s) for s in after[fresh[0]:])  # and remembered after


async def test_token_budget_is_respected(env, store, llm_env):
    script = TurnScript([lambda body: completion(None, [("read_baseline", {})], prompt_tokens=1000,
                                                 completion_tokens=30) for _ in range(20)],
                        compaction=lambda body: completion("notes", prompt_tokens=50, completion_tokens=5))
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm",
                                                budget={"iterations": 50, "tokens": 3500}), "llm-tok")
            res = await h.result()
        turns = server.turns()
    assert res.stopped_by == "budget-tokens"
    probed = sum(server.usage_total(server.probes()))  # the answers' probe, once, after the first turn
    assert res.used.turns == len(turns) == 4 and 3 * 1030 + probed < 3500  # 3 turns leave room for a 4th
    assert res.used.tokens == 4 * 1030 + probed and not server.compactions()  # no notebook rewrite once tokens are spent
    assert "> The token budget is spent" in store.get_text(res.notebook_key)
    # a token budget never becomes a reply cap: with no profile set, none is sent
    assert all("max_tokens" not in s.body and "max_completion_tokens" not in s.body for s in turns)


async def test_endpoint_down_then_back_the_run_waits_and_goes_on(env, store, llm_env):
    # The endpoint's port is bound but not listening for the run's first seconds: every call is refused
    # (a connection error, retried by Temporal with backoff), then the endpoint comes up and the run
    # goes on where it was, nothing lost and nothing paused.
    script = TurnScript([turn(submit(0)), turn(submit(5))])
    server = ChatServer(script)
    llm_env(server)
    async with workers(env.client):
        h = await start(env.client, spec(2), "llm-down")
        await asyncio.sleep(6)
        desc = await h.describe()
        pending = list(desc.raw_description.pending_activities)
        assert pending and pending[0].attempt >= 3, pending  # 1 s, 2 s, ... between attempts
        assert "connection failed" in pending[0].last_failure.message, pending[0].last_failure
        st = await h.query(KernelOptimization.status)
        assert not st.paused and st.iteration == 0
        with server:
            res = await h.result()
        turns = server.turns()
    assert res.stopped_by == "budget-iterations" and res.iterations == 2
    assert [s.status for s in turns] == [200, 200]  # nothing reached the server while it was down
    recs = read_ledger(store, res.ledger_key)
    assert [r.iteration for r in recs] == [1, 2]


async def test_pause_and_stop_while_the_endpoint_is_down_act_at_once(env, store, llm_env):
    # The endpoint refuses every connection: the turn would be retried for about half an hour. The
    # operator's pause takes effect within seconds and nothing asked of the model is lost (resumed with the
    # endpoint up, the same turn is asked, its hint in it); a stop while the endpoint fails again as well.
    script = TurnScript([turn(submit(0))])
    answered = []

    def respond(body, headers):  # one turn answered, then overloaded
        if answered:
            return error(503, "overloaded")
        answered.append(body)
        return script(body, headers)

    server = ChatServer(respond)
    llm_env(server)
    async with workers(env.client):
        h = await start(env.client, spec(3), "llm-down-stop")
        await until(lambda s: s.llm is not None and s.llm.turns, h, timeout=30)
        await asyncio.sleep(3.5)  # a few attempts failed: the turn waits in its backoff
        await h.signal(KernelOptimization.hint, Hint(text="keep it simple"))
        await h.signal(KernelOptimization.pause)
        st = await until(lambda s: s.phase == "paused", h, timeout=10)
        assert st.used.turns == 0 and st.pending_hints == 1
        assert not (await h.describe()).raw_description.pending_activities  # the turn was cancelled
        with server:
            await h.signal(KernelOptimization.resume)
            await until(lambda s: s.iteration == 1, h, timeout=60)
            await asyncio.sleep(2.5)  # the next turn fails and waits in its backoff
            stopped = time.monotonic()
            await h.signal(KernelOptimization.stop, {"reason": "endpoint down"})
            res = await asyncio.wait_for(h.result(), timeout=30)
    assert res.stopped_by == "stop-signal" and res.iterations == 1 and res.used.turns == 1
    assert time.monotonic() - stopped < 30
    assert "keep it simple" in prompt_text(server.turns()[0])  # the cancelled turn's hint reached the model
