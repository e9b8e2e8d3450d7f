"""First contact with a server that takes tools its own way, as llama-cpp-python's does (its replies,
checked against the real server: tests/llm/test_real_server.py): without a tool_choice it drops the tools
silently, "required" is an empty 500, and a chat format without function calling drops them always. The
request sends tool_choice; a dropped-tools server is found by a probe and the run goes on in text mode,
said once; llm-check names the cause and the fix."""

from __future__ import annotations

import logging
import os

from activities.ledger import read_ledger
from activities.llm.chat import chat
from activities.llm.check import llm_check
from activities.llm.endpoint import LlmSettings
from activities.llm.probe import counted
from activities.llm.tools import TEXT_PROTOCOL, TOOLS
from tests.llm.kernels import LADDER, softmax_kernel
from tests.llm.script import prompt_tokens
from tests.llm.server import ChatServer, Endpoint, completion
from tests.llm.test_endpoints import run_turn, turn_req
from tests.workflows.helpers import start, workers
from workflows.contracts import RunSpec

SRC = softmax_kernel(**LADDER[1])


def worker_endpoint():
    return LlmSettings.from_env(os.environ).endpoint()


def small_model(native_call: tuple[str, dict], text_reply: str):
    """A model that calls a tool natively when the request's tools reach it, writes `text_reply` when the
    prompt describes the text protocol, and otherwise says it has no tools (as SmolLM2 did)."""
    def respond(body, headers):
        if body.get("tools"):
            return completion(None, [native_call], prompt_tokens=prompt_tokens(body))
        if text_mode(body):
            return completion(text_reply, prompt_tokens=prompt_tokens(body))
        return completion("The provided tools are not available.", prompt_tokens=prompt_tokens(body))
    return respond


def text_mode(body) -> bool:
    """The prompt describes the text tool protocol."""
    return any(TEXT_PROTOCOL[:40] in (m.get("content") or "") for m in body.get("messages", []))


def test_the_probe_threshold_on_the_real_servers_figures():
    # llama-cpp-python 0.3.36 + SmolLM2, one 60-token schema: 58 prompt tokens without tool_choice (the
    # schema dropped) as without tools; 292 with tool_choice auto
    assert not counted(58, 58, 60) and counted(292, 58, 60)
    assert not counted(70, 58, 60)  # a template's few tokens of its own are not schemas


def test_tool_choice_keeps_the_tools_that_llama_cpp_python_drops_without_it(store, llm_env):
    with ChatServer(Endpoint("llama-cpp-python", small_model(("read_baseline", {}), "-"))) as server:
        llm_env(server)
        res = run_turn(turn_req())
        (seen,) = server.turns()
    assert seen.body["tool_choice"] == "auto" and seen.body["tools"]
    assert [c.name for c in res.tool_calls] == ["read_baseline"] and res.learned == [] and res.adapted == {}
    assert server.probes() == []  # a native call shows the tools reach the model: nothing to probe


def test_a_turn_that_must_act_sends_required_and_takes_auto_where_refused(llm_env):
    msgs = [{"role": "user", "content": "act"}]
    with ChatServer(Endpoint("vllm", small_model(("read_baseline", {}), "-"))) as server:
        llm_env(server)
        chat(msgs, worker_endpoint(), TOOLS, must_act=True)
        chat(msgs, worker_endpoint(), TOOLS)
        assert [s.body["tool_choice"] for s in server.turns()] == ["required", "auto"]
    with ChatServer(Endpoint("llama-cpp-python", small_model(("read_baseline", {}), "-"))) as server:
        llm_env(server)
        first = chat(msgs, worker_endpoint(), TOOLS, must_act=True)
        again = chat(msgs, worker_endpoint(), TOOLS, adapted=first.adapted, must_act=True)
        sent = [(s.body["tool_choice"], s.status) for s in server.turns()]
    assert sent == [("required", 500), ("auto", 200), ("auto", 200)]  # refused once, then kept for the run
    assert first.learned == ["the endpoint refuses tool_choice 'required': sending auto"]
    assert first.adapted == {"tool_choice": "auto", "required_turns": False} and again.learned == []
    assert [c["name"] for c in again.tool_calls] == ["read_baseline"]


def test_dropped_tools_are_found_and_the_next_turns_use_text_tools_said_once(store, llm_env, caplog):
    model = small_model(("read_baseline", {}), "TOOL: read_baseline")
    with ChatServer(Endpoint("llama-cpp-python-own-template", model)) as server:
        llm_env(server)
        with caplog.at_level(logging.WARNING):
            first = run_turn(turn_req())
            second = run_turn(turn_req(turn=2, adapted=first.adapted, conversation_key=first.conversation_key))
            third = run_turn(turn_req(turn=3, adapted=second.adapted, conversation_key=second.conversation_key))
        turns, probes = server.turns(), server.probes()
    assert turns[0].body["tool_choice"] == "auto" and not first.tool_calls  # the model saw no tools
    assert [bool(p.body.get("tools")) for p in probes] == [False, True]  # one pair, at first contact
    assert probes[0].usage["prompt_tokens"] == probes[1].usage["prompt_tokens"]
    (line,) = first.learned
    assert "drops the tool schemas from the prompt without a word" in line and "text tool mode" in line
    assert first.adapted == {"tool_mode": "text"} and second.learned == [] and second.adapted == first.adapted
    assert "tools" not in turns[1].body and TEXT_PROTOCOL[:40] in turns[1].body["messages"][0]["content"]
    assert [c.name for c in second.tool_calls] == ["read_baseline"] == [c.name for c in third.tool_calls]
    # the probe's tokens are paid: counted with the turn that sent it
    assert first.tokens_in == turns[0].usage["prompt_tokens"] + sum(p.usage["prompt_tokens"] for p in probes)
    assert sum("model endpoint adapted" in r.getMessage() for r in caplog.records) == 1


def test_a_model_answering_in_prose_where_the_tools_arrive_stays_native(store, llm_env):
    def prose(body, headers):
        return completion("Let me think about the softmax first.", prompt_tokens=prompt_tokens(body))

    with ChatServer(Endpoint("llama-cpp-python", prose)) as server:
        llm_env(server)
        first = run_turn(turn_req())
        second = run_turn(turn_req(turn=2, adapted=first.adapted, conversation_key=first.conversation_key))
        probes = server.probes()
    assert first.adapted == {} and first.learned == []
    assert "tool_mode" not in second.adapted  # (the turn after one that ran nothing must act: required, refused)
    assert len(probes) == 2 and probes[1].body["tool_choice"] == "auto"  # probed once per worker, not per turn
    assert all("tools" in s.body for s in server.turns())


def test_llm_check_names_dropped_tools_their_cause_and_the_fix(llm_env):
    model = small_model(("read_notebook", {}), "TOOL: read_notebook")
    reports = []
    for _ in range(2):
        with ChatServer(Endpoint("llama-cpp-python-own-template", model)) as server:
            llm_env(server).setenv("MARATHON_LLM_PROFILE", "llamacpp")
            ok, lines = llm_check()
        reports.append([x for x in lines if not x.startswith(("endpoint:", "reply:"))])
        text = "\n".join(lines)
        assert ok, text
        assert "adapted: the endpoint drops the tool schemas from the prompt without a word" in text
        assert "cause: the server takes the `tools` of a request and leaves them out of the prompt" in text
        assert "--chat_format chatml-function-calling" in text and "--jinja" in text
        assert "MARATHON_LLM_TOOL_MODE=text" in text and "tool calls: text mode (read_notebook)" in text
    assert reports[0] == reports[1]  # the same finding every time: counted tokens, not the model's whim
    with ChatServer(Endpoint("llama-cpp-python-own-template", model)) as server:
        llm_env(server).setenv("MARATHON_LLM_TOOL_MODE", "native")
        ok, lines = llm_check()
    assert not ok and "NOT OK: the tools never reach the model" in lines[-1]
    assert any(x.startswith("cause:") and "MARATHON_LLM_TOOL_MODE=native keeps" in x for x in lines)


def test_llm_check_on_llama_cpp_python_with_function_calling(llm_env):
    with ChatServer(Endpoint("llama-cpp-python", small_model(("read_notebook", {}), "-"))) as server:
        llm_env(server).setenv("MARATHON_LLM_PROFILE", "llamacpp")
        ok, lines = llm_check()
        (seen,) = server.turns()
    text = "\n".join(lines)
    assert ok, text
    # one tool that must be called: named, the form of "required" that llama-cpp-python takes
    assert seen.body["tool_choice"] == {"type": "function", "function": {"name": "read_notebook"}}
    assert "tool calls: native (read_notebook)" in text and "cause:" not in text
    assert "tool schemas: they reach the model (" in text  # the probe, not the named call, says so
    # its chat format renders a tool message without the answer: found, and the setting named
    assert [x for x in lines if x.startswith("adapted:")] == [
        next(x for x in lines if x.startswith("adapted: the endpoint drops the tools' answers"))]
    assert "MARATHON_LLM_TOOL_ANSWERS=user" in text


def test_arguments_with_raw_newlines_in_a_string_are_read(store, llm_env):
    # llama-cpp-python's JSON grammar lets a string hold raw newlines; json.loads refuses them by default
    raw = '{"source": "' + SRC.replace("\\", "\\\\").replace('"', '\\"') + '", "rationale": "one pass"}'
    assert "\n" in raw
    with ChatServer(Endpoint("llama-cpp-python", lambda b, h: completion(None, [("submit_kernel", raw)]))) as server:
        llm_env(server)
        res = run_turn(turn_req())
    (call,) = res.tool_calls
    assert call.error is None and call.source_key and call.args["rationale"] == "one pass"
    assert store.get_text(call.source_key) == SRC


async def test_a_run_on_a_server_that_drops_tools_records_its_submissions(env, store, llm_env):
    def submitting(body, headers):
        if text_mode(body):
            i = sum(m["role"] == "assistant" for m in body["messages"])
            return completion(f"TOOL: submit_kernel rationale=\"rung {i}\"\n```python\n"
                              f"{softmax_kernel(**LADDER[i % len(LADDER)])}```", prompt_tokens=prompt_tokens(body))
        return completion("I do not have tools.", prompt_tokens=prompt_tokens(body))

    with ChatServer(Endpoint("llama-cpp-python-own-template", submitting)) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 2}),
                            "llm-dropped")
            res = await h.result()
        probes = server.probes()
    assert res.stopped_by == "budget-iterations" and res.iterations == 2
    assert [r.iteration for r in read_ledger(store, res.ledger_key)] == [1, 2]
    assert len(probes) == 2 and res.used.turns == 3  # the first turn saw no tools; two in text mode submitted
    assert res.used.tokens_in == server.usage_total()[0]  # the probe's tokens counted too


ANSWERED = [{"role": "user", "content": "act"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_baseline", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "the baseline takes 1.25 ms"}]


def test_dropped_tool_answers_are_found_and_repeated_in_a_user_message_said_once(llm_env):
    with ChatServer(Endpoint("llama-cpp-python", small_model(("read_baseline", {}), "-"))) as server:
        llm_env(server)
        first = chat(ANSWERED, worker_endpoint(), TOOLS)
        again = chat(ANSWERED, worker_endpoint(), TOOLS, adapted=first.adapted)
        probes = server.probes()
    assert first.adapted == {"tool_answers": "user"} and len(probes) == 2
    assert first.learned[0].startswith("the endpoint drops the tools' answers from the prompt without a word (")
    assert again.learned == [] and len(probes) == 2  # probed once; the run keeps what it learned
    with ChatServer(Endpoint("vllm", small_model(("read_baseline", {}), "-"))) as server:
        llm_env(server)
        kept = chat(ANSWERED, worker_endpoint(), TOOLS)
        assert kept.adapted == {} and len(server.probes()) == 2  # a server that shows the answers: no change


def test_repeated_answers_reach_the_model_in_a_user_message(store):
    from activities.llm.history import ANSWER_MOVED, history_units
    from workflows.contracts import ToolResult

    turns = [{"assistant": {"content": "", "tool_calls": [{"id": "c1", "name": "read_baseline", "arguments": "{}"}]},
              "calls": [], "results": []}]
    pending = [ToolResult(call_id="c1", name="read_baseline", content="the baseline takes 1.25 ms")]
    (plain,) = history_units(turns, pending, store, 4000)
    (moved,) = history_units(turns, pending, store, 4000, answers_in_user=True)
    assert [m["role"] for m in plain] == ["assistant", "tool"] and "1.25 ms" in plain[1]["content"]
    assert [m["role"] for m in moved] == ["assistant", "tool", "user"]  # every call still answered by a tool message
    assert moved[1]["content"] == ANSWER_MOVED
    assert moved[2]["content"] == "## Result of read_baseline (call 1)\nthe baseline takes 1.25 ms"


def test_a_turn_that_must_submit_keeps_every_tool_where_the_profile_narrows_by_choice():
    """llama-cpp-python renders the tools ahead of the messages: a narrowed turn that offered submit_kernel
    alone began a new prompt, evaluated in full on a CPU; with every tool and the function named, the
    prompt's start is the last turn's and the server's cache covers it. Other profiles offer it alone."""
    from dataclasses import replace
    from types import SimpleNamespace

    from activities.llm.chat import request_kwargs
    from activities.llm.endpoint import PROFILES

    ep, msgs = SimpleNamespace(model="m"), [{"role": "user", "content": "submit"}]
    named = {"type": "function", "function": {"name": "submit_kernel"}}
    kw = request_kwargs(ep, PROFILES["llamacpp"], msgs, TOOLS, only="submit_kernel")
    assert kw["tools"] == TOOLS and kw["tool_choice"] == named
    kw = request_kwargs(ep, PROFILES["vllm"], msgs, TOOLS, only="submit_kernel")
    assert [t["function"]["name"] for t in kw["tools"]] == ["submit_kernel"] and kw["tool_choice"] == named
    # where a required call was refused (the run adapted to auto), the tool is offered alone again
    kw = request_kwargs(ep, replace(PROFILES["llamacpp"], required_turns=False), msgs, TOOLS, only="submit_kernel")
    assert [t["function"]["name"] for t in kw["tools"]] == ["submit_kernel"] and kw["tool_choice"] == "auto"
    assert request_kwargs(ep, PROFILES["llamacpp"], msgs, TOOLS)["tool_choice"] == "auto"  # not narrowed
