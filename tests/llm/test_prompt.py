"""The llm turn's prompt and reply parsing, without a server: the context budget, code extraction."""

from __future__ import annotations

from activities.llm import TOOLS, build_messages, estimate_tokens, extract_code, parse_calls, Reply
from tests.llm.kernels import LADDER, softmax_kernel
from workflows.contracts import Budget, LlmTurnRequest, Used


def req(store, **kw) -> LlmTurnRequest:
    base = dict(workflow_id="w", problem="softmax", turn=7, iteration=3, budget=Budget(iterations=100),
                used=Used(iterations=3, turns=6, tool_calls=11), context_tokens=24000)
    return LlmTurnRequest(**{**base, **kw})


def test_prompt_fits_the_context_budget_and_keeps_the_objective(store):
    notebook = "# Notebook: softmax, version 9\nprevious version: none\n" + "".join(
        f"- idea {i}: tried BLOCK_N={i} and it was slower because of something long enough\n" for i in range(2000))
    key = store.put_text(notebook)
    big = build_messages(req(store, notebook_key=key, context_tokens=200_000), store)
    assert "idea 1999" in big[1]["content"]
    small = build_messages(req(store, notebook_key=key, context_tokens=4000), store)
    assert estimate_tokens(small) + estimate_tokens(TOOLS) <= 4000
    text = small[1]["content"]
    assert "# Objective" in text and "Remaining budget: 97 of 100 submissions" in text
    assert "notebook shortened" in text and "idea 0:" in text and "idea 1999" in text  # head and tail kept
    assert small[-1]["role"] == "user" and small[-1]["content"].startswith("Turn 7.")


def test_hints_are_new_in_the_prompt(store):
    msgs = build_messages(req(store, hints=["use num_warps=8"]), store)
    assert "New hints from the operator" in msgs[-1]["content"] and "num_warps=8" in msgs[-1]["content"]


def test_code_extraction():
    src = softmax_kernel(**LADDER[2])
    assert extract_code(f"Try this:\n```python\n{src}```\nthanks") == src
    assert extract_code(f"```\n{src}```") == src
    assert extract_code(src) == src  # a bare module
    assert extract_code("```python\nprint('no run here')\n```") is None
    assert extract_code("I would increase BLOCK_N.") is None


def test_parse_calls_stores_sources_and_rejects_bad_arguments(store):
    src = softmax_kernel(**LADDER[1])
    reply = Reply(content="", tool_calls=[
        {"id": "a", "name": "submit_kernel", "arguments": '{"source": ' + __import__("json").dumps(src) +
         ', "rationale": "r"}'},
        {"id": "b", "name": "benchmark", "arguments": '{"source": "import os\\ndef run(inputs, out):\\n  pass\\n"}'},
        {"id": "c", "name": "profile", "arguments": "{not json"},
        {"id": "d", "name": "launch_missiles", "arguments": "{}"},
        {"id": "e", "name": "check", "arguments": '["a list"]'},
    ])
    calls, feedback = parse_calls(reply, 1, "softmax", store)
    assert feedback == ""
    a, b, c, d, e = calls
    assert store.get_text(a.source_key) == src and "source" not in a.args and a.error is None
    assert b.rules_error == "escape: line 1: import of 'os' is not allowed in a candidate"
    assert "not valid JSON" in c.error and "unknown tool" in d.error and "JSON object" in e.error
    none, fb = parse_calls(Reply(content="thinking..."), 2, "softmax", store)
    assert none == [] and "no tool call" in fb
