"""One model turn (the real `llm_turn` activity and the openai client) against the scripted server behaving
like each kind of endpoint: profiles, what adapts and what pauses, reply shapes, context limits, llm-check."""

from __future__ import annotations

import json
import os

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.ledger import append_chunk
from activities.llm.activities import LlmActivities
from activities.llm.check import llm_check
from activities.llm.tools import TEXT_PROTOCOL
from activities.search import candidate_id
from activities.settings import AgentSettings
from tests.llm.kernels import LADDER, softmax_kernel
from tests.llm.script import prompt_tokens
from tests.llm.server import ChatServer, Endpoint, Kind, Reply, completion, error, prompt_text
from workflows.contracts import Budget, IterationRecord, LlmTurnRequest, Used

SRC = softmax_kernel(**LADDER[2])


def turn_req(**kw) -> LlmTurnRequest:
    base = dict(workflow_id="w", problem="softmax", turn=1, iteration=0, budget=Budget(iterations=10),
                used=Used())
    return LlmTurnRequest(**{**base, **kw})


def run_turn(req: LlmTurnRequest):
    return ActivityEnvironment().run(LlmActivities(AgentSettings.from_env()).llm_turn, req)


def answer(*calls, content: str | None = None):
    return lambda body, headers: completion(content, list(calls), prompt_tokens=prompt_tokens(body))


def bodies(server) -> list[dict]:
    return [{k: v for k, v in s.body.items() if k not in ("messages", "tools")} | {"tools": bool(s.body.get("tools"))}
            for s in server.turns()]


def test_token_budget_never_becomes_the_reply_cap(store, llm_env):
    with ChatServer(Endpoint("vllm", answer(("read_baseline", {})))) as server:
        llm_env(server).setenv("MARATHON_LLM_PROFILE", "vllm")
        res = run_turn(turn_req(budget=Budget(iterations=10, tokens=2_000_000)))
        llm_env(server).delenv("MARATHON_LLM_PROFILE")  # no profile: nothing is sent as a reply cap
        run_turn(turn_req(budget=Budget(iterations=10, tokens=2_000_000)))
    first, second = bodies(server)
    assert first["max_tokens"] == 8192 and "max_completion_tokens" not in first  # the profile's cap
    assert "max_tokens" not in second and "max_completion_tokens" not in second
    assert [c.name for c in res.tool_calls] == ["read_baseline"]


def test_reasoning_profile_sends_max_completion_tokens(store, llm_env):
    with ChatServer(Endpoint("openai-reasoning", answer(("read_baseline", {})))) as server:
        llm_env(server).setenv("MARATHON_LLM_PROFILE", "openai-reasoning")
        res = run_turn(turn_req())
    (b,) = bodies(server)
    assert b["max_completion_tokens"] == 32768 and b["reasoning_effort"] == "medium" and "max_tokens" not in b
    assert res.learned == [] and res.adapted == {}


def test_refused_parameter_is_replaced_once_and_kept_for_the_run(store, llm_env):
    with ChatServer(Endpoint("openai-reasoning", answer(("read_baseline", {})))) as server:
        llm_env(server).setenv("MARATHON_LLM_MAX_TOKENS", "4000")
        first = run_turn(turn_req())
        second = run_turn(turn_req(turn=2, adapted=first.adapted, conversation_key=first.conversation_key))
    assert [s.status for s in server.turns()] == [400, 200, 200]
    assert first.adapted == {"token_param": "max_completion_tokens"}
    assert first.learned == ["the endpoint refuses max_tokens: sending max_completion_tokens instead"]
    assert second.learned == [] and second.adapted == first.adapted  # not learned again
    assert [b.get("max_completion_tokens") for b in bodies(server)] == [None, 4000, 4000]


def test_a_setting_the_worker_fixed_is_not_changed_the_run_pauses_naming_it(store, llm_env):
    with ChatServer(Endpoint("openai-reasoning", answer(("read_baseline", {})))) as server:
        llm_env(server).setenv("MARATHON_LLM_TEMPERATURE", "0.2")
        with pytest.raises(ApplicationError) as e:
            run_turn(turn_req())
    assert e.value.non_retryable and e.value.type == "LLMConfigError"
    assert "MARATHON_LLM_TEMPERATURE" in e.value.message and "'temperature' does not support" in e.value.message


@pytest.mark.parametrize("kind", ["vllm-no-tools", "ollama", "llamacpp"])
def test_endpoint_without_tools_switches_to_text_mode(store, llm_env, kind):
    text = f"I will compile first.\nTOOL: compile\n```python\n{SRC}```\nTOOL: read_starting_kernel lines=1-40\n"
    with ChatServer(Endpoint(kind, answer(content=text))) as server:
        llm_env(server)
        res = run_turn(turn_req())
    first, second = server.turns()
    assert first.status in (400, 500) and second.status == 200
    assert not second.body.get("tools") and TEXT_PROTOCOL[:60] in prompt_text(second)
    assert res.adapted["tool_mode"] == "text" and "text tool mode" in res.learned[0]
    compile_call, read_call = res.tool_calls
    assert compile_call.name == "compile" and compile_call.candidate_id == candidate_id(SRC)
    assert store.get_text(compile_call.source_key) == SRC
    assert read_call.name == "read_starting_kernel" and read_call.args == {"start_line": 1, "end_line": 40}


def test_native_tool_mode_on_an_endpoint_without_tools_pauses_naming_the_setting(store, llm_env):
    with ChatServer(Endpoint("vllm-no-tools", answer(("read_baseline", {})))) as server:
        llm_env(server).setenv("MARATHON_LLM_PROFILE", "openai-chat")
        with pytest.raises(ApplicationError) as e:
            run_turn(turn_req())
    assert e.value.non_retryable and "MARATHON_LLM_TOOL_MODE=text" in e.value.message
    assert "--enable-auto-tool-choice" in e.value.message
    assert len(server.turns()) == 1  # not retried: it cannot work as configured


@pytest.mark.parametrize("kind", ["strict-template", "gemma"])
def test_strict_chat_template_gets_alternating_roles(store, llm_env, kind):
    with ChatServer(Endpoint(kind, answer(("read_baseline", {})))) as server:
        llm_env(server)
        first = run_turn(turn_req())
        # the next turn has history (assistant, tool, then two user messages before merging)
        run_turn(turn_req(turn=2, adapted=first.adapted, conversation_key=first.conversation_key,
                          tool_results=[{"call_id": first.tool_calls[0].call_id, "name": "read_baseline",
                                         "content": "the baseline"}]))
    statuses = [s.status for s in server.turns()]
    assert statuses[-1] == 200 and statuses.count(400) == (1 if kind == "strict-template" else 2)
    assert first.adapted["merge_roles"] is True
    for s in server.turns()[-2:]:
        roles = [m["role"] for m in s.body["messages"] if m["role"] != "tool"]
        assert all(a != b for a, b in zip(roles, roles[1:])), roles
        assert (kind == "gemma") == ("system" not in roles)


@pytest.mark.parametrize("style", ["hermes", "mistral", "bare"])
def test_tool_calls_written_as_text_are_parsed_and_replayed_as_calls(store, llm_env, style):
    call = {"name": "check", "arguments": {"source": SRC}}
    content = {"hermes": f"Let me check it.\n<tool_call>\n{json.dumps(call)}\n</tool_call>",
               "mistral": f"[TOOL_CALLS] {json.dumps([call])}",
               "bare": json.dumps({"name": "check", "parameters": {"source": SRC}})}[style]
    with ChatServer(Endpoint("vllm", answer(content=content))) as server:
        llm_env(server)
        res = run_turn(turn_req())
        (c,) = res.tool_calls
        run_turn(turn_req(turn=2, conversation_key=res.conversation_key,
                          tool_results=[{"call_id": c.call_id, "name": "check", "content": "correct"}]))
    assert c.name == "check" and c.candidate_id == candidate_id(SRC) and c.error is None
    replay = server.turns()[1].body["messages"]
    assistant = next(m for m in replay if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["id"] == c.call_id and "<tool_call>" not in (assistant["content"] or "")
    assert any(m["role"] == "tool" and m["tool_call_id"] == c.call_id and m["content"] == "correct" for m in replay)


def test_odd_reply_shapes_are_normalised_and_reasoning_is_not_replayed(store, llm_env):
    def respond(body, headers):
        return completion("<think>SECRET-THOUGHTS about blocks</think>Reading the baseline.",
                          [("read_baseline", {"start_line": 1})], object_arguments=True, content_parts=True,
                          reasoning_content="MORE-REASONING", prompt_tokens=321, completion_tokens=54)

    with ChatServer(Endpoint("sglang", respond)) as server:
        llm_env(server)
        res = run_turn(turn_req())
        run_turn(turn_req(turn=2, conversation_key=res.conversation_key,
                          tool_results=[{"call_id": res.tool_calls[0].call_id, "name": "read_baseline",
                                         "content": "baseline source"}]))
    assert [c.name for c in res.tool_calls] == ["read_baseline"] and res.tool_calls[0].args == {"start_line": 1}
    assert (res.tokens_in, res.tokens_out) == (321, 54)
    record = store.get_json(res.conversation_key)
    assert "SECRET-THOUGHTS" in record["assistant"]["reasoning"] and "MORE-REASONING" in record["assistant"]["reasoning"]
    replay = json.dumps(server.turns()[1].body["messages"])
    assert "Reading the baseline." in replay and "SECRET-THOUGHTS" not in replay and "MORE-REASONING" not in replay


def test_a_cut_off_reply_is_told_as_cut_off(store, llm_env):
    cut = completion(None, [("submit_kernel", '{"source": "import triton\\n@triton.jit\\ndef k(')],
                     finish_reason="length", completion_tokens=8192)
    with ChatServer(Endpoint("vllm", lambda b, h: cut)) as server:
        llm_env(server)
        res = run_turn(turn_req())
    (c,) = res.tool_calls
    assert "cut off at the reply limit" in c.error and "JSON" not in c.error
    assert "cut off at the reply limit (8192 tokens)" in res.feedback


def test_repeated_tool_call_ids_in_one_reply_are_made_unique(store, llm_env):
    with ChatServer(Endpoint("ollama", lambda b, h: completion(None, [("read_baseline", {}), ("read_oracle", {})],
                                                                call_ids=["call_0", "call_0"]))) as server:
        llm_env(server).setenv("MARATHON_LLM_TOOL_MODE", "native")
        server.respond.rules = Kind()  # a model with tool support
        res = run_turn(turn_req())
    ids = [c.call_id for c in res.tool_calls]
    assert [c.name for c in res.tool_calls] == ["read_baseline", "read_oracle"] and len(set(ids)) == 2


def test_an_unreadable_reply_is_answered_and_its_tokens_counted(store, llm_env):
    odd = completion("hello", prompt_tokens=77, completion_tokens=11)
    odd.body["choices"][0]["message"]["tool_calls"] = [{"id": 5, "function": {"name": ["x"], "arguments": 3}}, "junk"]
    with ChatServer(Endpoint("vllm", lambda b, h: odd)) as server:
        llm_env(server)
        res = run_turn(turn_req())
    assert (res.tokens_in, res.tokens_out) == (77, 11)
    (c,) = res.tool_calls
    assert c.error and "unknown tool" in c.error  # answered, no traceback
    assert len(server.turns()) == 1


@pytest.mark.parametrize("kind", ["small-context", "llamacpp"])
def test_context_exceeded_shrinks_the_prompt_and_keeps_the_limit(store, llm_env, kind):
    notebook = store.put_text("# Notebook\n" + "".join(f"- idea {i}: a long line about tiles and warps\n"
                                                      for i in range(1300)))
    with ChatServer(Endpoint(kind, answer(("read_baseline", {})))) as server:
        llm_env(server)
        if kind == "llamacpp":  # started with --jinja: it takes tools
            server.respond.rules = Kind(context=6000, context_error="llamacpp")
        res = run_turn(turn_req(notebook_key=notebook))
        again = run_turn(turn_req(turn=2, notebook_key=notebook, adapted=res.adapted))
    statuses = [s.status for s in server.turns()]
    assert statuses == [400, 200, 200]
    assert res.adapted == {"context_tokens": 6000} and again.learned == []
    assert "context" in res.learned[0]


def test_context_too_small_pauses_naming_context_tokens(store, llm_env):
    with ChatServer(Endpoint("small-context", answer(("read_baseline", {})))) as server:
        server.respond.rules = Kind(context=1200, context_error="vllm")
        llm_env(server)
        with pytest.raises(ApplicationError) as e:
            run_turn(turn_req())
    assert e.value.non_retryable and e.value.type == "LLMContextError"
    msg = e.value.message
    assert "context of 1200 tokens" in msg and "--context-tokens" not in msg  # the run's cap would not help
    assert "Start the server with a context of at least" in msg and "--n_ctx" in msg, msg


def test_auth_and_quota_pause_with_the_remedy(store, llm_env):
    for reply, words in ((error(401, "Incorrect API key provided"), "Set a valid OPENAI_API_KEY"),
                         (error(429, "You exceeded your current quota", code="insufficient_quota"), "Add credit")):
        with ChatServer(lambda b, h, r=reply: r) as server:
            llm_env(server)
            with pytest.raises(ApplicationError) as e:
                run_turn(turn_req())
        assert e.value.non_retryable and words in e.value.message and "marathon resume" in e.value.message


def test_a_web_page_for_a_reply_pauses_naming_the_base_url_and_a_cut_off_reply_is_retried(store, llm_env):
    # an OPENAI_BASE_URL naming a web UI or a proxy's page gets a page for every path: waiting does not help
    page = Reply(200, text="<!DOCTYPE html><html><body>Welcome to nginx!</body></html>",
                 headers={"Content-Type": "text/html"})
    cut = Reply(200, text='{"choices": [')
    for reply, retried in ((page, False), (cut, True)):
        with ChatServer(lambda b, h, r=reply: r) as server:
            llm_env(server)
            with pytest.raises(ApplicationError) as e:
                run_turn(turn_req())
        assert e.value.non_retryable is not retried, e.value
        if not retried:
            assert "web page" in e.value.message and "OPENAI_BASE_URL" in e.value.message, e.value.message


def test_json_that_is_no_chat_completion_pauses_naming_what_to_check_and_a_garbled_one_is_retried(store, llm_env):
    # another JSON API behind OPENAI_BASE_URL, or an error sent with a 200: waiting does not change either;
    # a proxy's upstream failure sent with a 200 (OpenRouter's, its status as the code) and choices in no
    # readable shape may pass
    cases = ((Reply(200, {}), False, ("`choices`", "OPENAI_BASE_URL")),
             (Reply(200, {"object": "list", "data": []}), False, ("`choices`", "OPENAI_BASE_URL")),
             (Reply(200, {"error": {"message": "model 'gpt-9' not found", "type": "invalid_request_error"}}), False,
              ("200 with an error", "model 'gpt-9' not found", "MARATHON_MODEL")),
             (Reply(200, {"error": {"message": "Provider returned error", "code": 502}}), True, ("502",)),
             (Reply(200, {"error": {"message": "Rate limit exceeded", "code": 429}}), True, ("429",)),
             (Reply(200, {"id": "x", "choices": []}), True, ("no choices",)))
    for reply, retried, words in cases:
        with ChatServer(lambda b, h, r=reply: r) as server:
            llm_env(server)
            with pytest.raises(ApplicationError) as e:
                run_turn(turn_req())
        assert e.value.non_retryable is not retried, (reply.body, e.value)
        assert all(w in e.value.message for w in words), (words, e.value.message)


def test_a_source_in_the_ledger_is_a_duplicate(store, llm_env):
    rec = IterationRecord(iteration=1, candidate_id=candidate_id(SRC), source_key=store.put_text(SRC),
                          outcome="passed", speedup=1.3, time_ms=0.5, baseline_ms=0.65)
    ledger = append_chunk(store, None, "w", 1, [rec])
    with ChatServer(Endpoint("vllm", answer(("submit_kernel", {"source": SRC, "rationale": "again"})))) as server:
        llm_env(server)
        res = run_turn(turn_req(ledger_key=ledger))
    (c,) = res.tool_calls
    assert "already evaluated: iteration 1: passed, 1.300x" in c.error


@pytest.mark.parametrize("kind,profile", [("openai-chat", "openai-chat"), ("openai-reasoning", "openai-reasoning"),
                                          ("vllm", "vllm"), ("sglang", "sglang"), ("ollama", "ollama"),
                                          ("llamacpp", "llamacpp"), ("openai-reasoning", "auto")])
def test_llm_check_reports_what_works(llm_env, kind, profile):
    def respond(body, headers):
        if body.get("tools"):
            return completion(None, [("read_notebook", {})])
        return completion("TOOL: read_notebook")

    with ChatServer(Endpoint(kind, respond)) as server:
        llm_env(server).setenv("MARATHON_LLM_PROFILE", profile)
        if profile == "auto":
            llm_env(server).setenv("MARATHON_LLM_MAX_TOKENS", "500")
        ok, lines = llm_check()
    text = "\n".join(lines)
    assert ok, text
    assert f"profile {profile}" in lines[0] and "OK: a run can use this endpoint" in text
    if kind in ("ollama", "llamacpp"):
        assert "tool calls: text mode (read_notebook)" in text and "MARATHON_LLM_TOOL_MODE=text" in text
    else:
        assert "tool calls: native (read_notebook)" in text
    if profile == "auto":
        assert "MARATHON_LLM_TOKEN_PARAM=max_completion_tokens" in text


def test_llm_check_names_a_bad_setting(llm_env, monkeypatch):
    with ChatServer(Endpoint("vllm", answer(("read_notebook", {})))) as server:
        llm_env(server).setenv("MARATHON_LLM_PROFILE", "gpt")
        ok, lines = llm_check()
    assert not ok and "MARATHON_LLM_PROFILE='gpt'" in lines[0] and "openai-reasoning" in lines[0]


def test_llm_check_says_when_the_endpoint_does_not_list_the_model(llm_env, capsys):
    from cli import main

    # llama-cpp-python's server answers a request for any model name with the one model it serves
    with ChatServer(Endpoint("vllm", answer(("read_notebook", {})))) as server:
        llm_env(server)
        unlisted_ok, unlisted = llm_check()  # no /v1/models: nothing said of the name
        server.info["/v1/models"] = ["not", "the", "openai", "shape"]
        odd_ok, odd = llm_check()
        server.info["/v1/models"] = {"object": "list", "data": [
            {"id": "SmolLM2-135M-Instruct", "object": "model"}, {"id": "qwen2.5-coder:latest", "object": "model"}]}
        assert main(["llm-check"]) == 1
        wrong = capsys.readouterr().out.splitlines()
        llm_env(server, model="SmolLM2-135M-Instruct")
        right_ok, right = llm_check()
        llm_env(server, model="qwen2.5-coder")  # Ollama's name without its tag
        tagless_ok, tagless = llm_check()
    assert wrong[-1] == ("NOT OK: the endpoint does not list the model scripted-model at /v1/models; it lists "
                         "SmolLM2-135M-Instruct, qwen2.5-coder:latest: set MARATHON_MODEL (or --model) to one of them")
    assert sum("/v1/models" in line for line in wrong) == 1, wrong
    for ok, lines in ((unlisted_ok, unlisted), (odd_ok, odd), (right_ok, right), (tagless_ok, tagless)):
        assert ok and not any("/v1/models" in line for line in lines), lines


def test_llm_check_speaks_of_llm_check_not_of_a_run_or_a_worker(llm_env):
    unknown = error(404, "The model `gpt-9` does not exist or you do not have access to it.", code="model_not_found")
    with ChatServer(Endpoint("openai-reasoning", lambda b, h: unknown)) as server:
        llm_env(server)
        _, missing = llm_check()
        llm_env(server, model="")
        _, unnamed = llm_check()
        llm_env(server, model="o4-mini").setenv("MARATHON_LLM_TEMPERATURE", "0.2")
        _, fixed = llm_check()  # a setting a variable fixed, refused: its config error
    assert "404" in missing[-1] and "MARATHON_LLM_TEMPERATURE" in fixed[-1], (missing, fixed)
    assert unnamed[-1] == "configuration: no model: set MARATHON_MODEL on the agent worker or pass --model", unnamed
    for line in (missing[-1], fixed[-1]):
        assert line.endswith(", then run `marathon llm-check` again."), line
    for line in (missing[-1], unnamed[-1], fixed[-1]):
        assert "marathon resume" not in line and f"agent worker {os.getpid()}" not in line, line
    # every remedy a run's message ends with reads as llm-check's
    from activities.llm.check import for_check

    for tail in (", restart it, then `marathon resume`.", "; set it, restart the worker, then `marathon resume`",
                 " (llama.cpp: --jinja), then restart the agent worker and `marathon resume`.",
                 "MARATHON_LLM_CONTEXT_TOKENS, then `marathon resume ID`."):
        assert "marathon resume" not in for_check(tail) and "then run `marathon llm-check` again" in for_check(tail)


def test_marathon_llm_check_command(llm_env, capsys):
    from cli import main

    def respond(body, headers):
        return completion("TOOL: read_notebook")

    with ChatServer(Endpoint("ollama", respond)) as server:
        llm_env(server)
        assert main(["llm-check", "--profile", "ollama"]) == 0
        out = capsys.readouterr().out
        assert "profile ollama" in out and "tool calls: text mode" in out
        llm_env(server, model="")
        assert main(["llm-check"]) == 1
        assert "no model" in capsys.readouterr().out
