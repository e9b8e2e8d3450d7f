"""The prompt within the endpoint's context, against the scripted server: the reply cap follows the context
(the server's own word for it where it gives one), what always stays in the prompt, and what a context too
small is told to change."""

from __future__ import annotations

import json

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.llm.activities import LlmActivities
from activities.llm.context import from_models, from_props
from activities.llm.replies import estimate_tokens
from activities.settings import AgentSettings
from baselines.registry import get_problem
from tests.llm.script import prompt_tokens
from tests.llm.server import ChatServer, completion
from workflows.contracts import Budget, LlmTurnRequest, ToolResult, Used

TEMPLATE = get_problem("softmax").template()
# what a weak model sends when its reply runs to the cap: a long, broken module (about 4,000 tokens)
LONG_BROKEN = TEMPLATE.replace("def run(", "def run(:\n", 1) + "".join(
    f"# the kernel loads a row, subtracts the max, exponentiates and normalises, step {i}\n" for i in range(190))


@pytest.fixture(autouse=True)
def fresh_probes():
    """What servers said of their context is kept per address for a while: a port a later test reuses
    must not inherit what these tests' servers said."""
    from activities.llm import context

    context._PROBED.clear()
    yield
    context._PROBED.clear()


def turn_req(**kw) -> LlmTurnRequest:
    base = dict(workflow_id="w", problem="softmax", turn=1, iteration=0, budget=Budget(iterations=30), used=Used())
    return LlmTurnRequest(**{**base, **kw})


def run_turn(req):
    return ActivityEnvironment().run(LlmActivities(AgentSettings.from_env()).llm_turn, req)


def second_prompt(server, llm_env, **env) -> tuple[dict, str]:
    """Turn 1 submits LONG_BROKEN (rejected at compile); returns turn 2's request body and its text."""
    mp = llm_env(server)
    for k, v in env.items():
        mp.setenv(k, v)
    first = run_turn(turn_req())
    (call,) = first.tool_calls
    answer = ToolResult(call_id=call.call_id, name="submit_kernel", error=True,
                        content="iteration 1: rejected at compile: SyntaxError: invalid syntax (line 41)")
    run_turn(turn_req(turn=2, iteration=1, used=Used(iterations=1, turns=1), conversation_key=first.conversation_key,
                      tool_results=[answer]))
    body = server.turns()[-1].body
    return body, json.dumps(body["messages"])


def scripted():
    src = {"source": LONG_BROKEN, "rationale": "a first kernel"}
    replies = iter([lambda b: completion(None, [("submit_kernel", src)], prompt_tokens=prompt_tokens(b),
                                         completion_tokens=4096, finish_reason="length"),
                    lambda b: completion(None, [("read_starting_kernel", {})], prompt_tokens=prompt_tokens(b))])
    return lambda body, headers: next(replies)(body)


def test_at_8192_tokens_the_second_prompt_keeps_the_starting_kernel_and_the_last_turn(store, llm_env):
    assert estimate_tokens(LONG_BROKEN) > 3500
    with ChatServer(scripted()) as server:
        body, text = second_prompt(server, llm_env, MARATHON_LLM_PROFILE="llamacpp", MARATHON_LLM_CONTEXT_TOKENS="8192")
    # the profile's 4,096-token cap would leave the prompt no room: the reply gets a quarter of the context
    assert body["max_tokens"] == 2048
    assert estimate_tokens(body["messages"]) + estimate_tokens(body["tools"]) + body["max_tokens"] <= 8192
    assert "# The starting kernel" in text  # no best yet: the code to start from stays
    (assistant,) = [m for m in body["messages"] if m["role"] == "assistant"]
    assert assistant["tool_calls"][0]["function"]["name"] == "submit_kernel"  # the last turn stays ...
    tool = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    assert tool == ["ERROR: iteration 1: rejected at compile: SyntaxError: invalid syntax (line 41)"]  # ... answered
    # its 4,000-token kernel replays as what it is, not whole
    args = json.loads(assistant["tool_calls"][0]["function"]["arguments"])
    assert args["source"].startswith("[kernel ") and "against the starting kernel" in args["source"]


def test_a_reply_cap_the_worker_sets_is_kept_and_the_prompt_still_keeps_what_matters(store, llm_env):
    with ChatServer(scripted()) as server:
        body, text = second_prompt(server, llm_env, MARATHON_LLM_PROFILE="llamacpp",
                                   MARATHON_LLM_CONTEXT_TOKENS="8192", MARATHON_LLM_MAX_TOKENS="4096")
    assert body["max_tokens"] == 4096
    assert estimate_tokens(body["messages"]) + estimate_tokens(body["tools"]) + 4096 <= 8192
    assert "# The starting kernel" in text and "rejected at compile: SyntaxError" in text
    assert any(m["role"] == "assistant" and m.get("tool_calls") for m in body["messages"])


@pytest.mark.parametrize("route,info", [("/props", {"default_generation_settings": {"n_ctx": 8192}}),
                                        ("/v1/models", {"data": [{"id": "scripted-model", "max_model_len": 8192}]})])
def test_the_reply_cap_follows_the_context_the_server_reports(store, llm_env, route, info):
    with ChatServer(scripted()) as server:
        server.info[route] = info  # llama-server's /props, vLLM's /v1/models
        body, text = second_prompt(server, llm_env, MARATHON_LLM_PROFILE="llamacpp")  # the profile says 16384
    assert body["max_tokens"] == 2048 and "# The starting kernel" in text


def test_context_reports_of_other_servers():
    assert from_props({"n_ctx": 4096}) == 4096 and from_props({"default_generation_settings": {}}) is None
    listed = {"data": [{"id": "a", "context_length": 32768}, {"id": "b", "context_length": 8192}]}  # OpenRouter's
    assert from_models(listed, "b") == 8192
    assert from_models({"data": [{"id": "only", "object": "model"}]}, "only") is None  # llama-cpp-python's
    assert from_models({"data": [{"id": "x", "max_model_len": 4096}]}, "other") == 4096  # the only one served


def test_a_context_too_small_says_what_would_help_and_following_it_works(store, llm_env):
    with ChatServer(scripted()) as server:
        mp = llm_env(server)
        mp.setenv("MARATHON_LLM_PROFILE", "llamacpp")
        mp.setenv("MARATHON_LLM_CONTEXT_TOKENS", "2048")
        with pytest.raises(ApplicationError) as small:
            run_turn(turn_req())
        mp.setenv("MARATHON_LLM_CONTEXT_TOKENS", "6144")
        mp.setenv("MARATHON_LLM_MAX_TOKENS", "4096")
        with pytest.raises(ApplicationError) as capped:
            run_turn(turn_req())
        msg = capped.value.message
        lower = int(msg.split("MARATHON_LLM_MAX_TOKENS (now 4096) to ")[1].split()[0])
        mp.setenv("MARATHON_LLM_MAX_TOKENS", str(lower))  # what the message said
        res = run_turn(turn_req())
    assert small.value.type == "LLMContextError" and small.value.non_retryable
    text = small.value.message
    assert "context of 2048 tokens" in text and "--context-tokens" not in text
    need = int(text.split("a context of at least ")[1].split()[0])
    assert need > 2048 and "-c N" in text and "--n_ctx N" in text and "MARATHON_LLM_CONTEXT_TOKENS" in text
    assert "MARATHON_LLM_MAX_TOKENS" not in text  # a smaller reply cap would not make room here
    assert len(server.turns()) == 1 and res.tool_calls  # only the turn that fits was sent
    assert server.turns()[0].body["max_tokens"] == lower


def test_llm_check_at_a_context_that_cannot_hold_the_prompt_is_not_ok(llm_env):
    from activities.llm.check import llm_check

    def respond(body, headers):
        return completion(None, [("read_notebook", {})])

    with ChatServer(respond) as server:
        mp = llm_env(server)
        mp.setenv("MARATHON_LLM_PROFILE", "llamacpp")
        mp.setenv("MARATHON_LLM_CONTEXT_TOKENS", "2048")
        small_ok, small = llm_check()
        mp.setenv("MARATHON_LLM_CONTEXT_TOKENS", "8192")
        ok, lines = llm_check()
    text = "\n".join(small)
    assert not small_ok and "NOT OK: a run's prompt does not fit the endpoint's context" in text, text
    assert "context of 2048 tokens" in text and "a context of at least" in text and "max_tokens=512" in text
    assert ok and "max_tokens=2048" in lines[1] and "OK: a run can use this endpoint" in lines[-1], lines
