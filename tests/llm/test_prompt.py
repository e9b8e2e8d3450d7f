"""The llm turn's prompt and reply parsing, without a server: the context budget, code extraction."""

from __future__ import annotations

import json

from activities.llm.calls import parse_calls
from activities.llm.prompt import build_messages
from activities.llm.replies import Reply, estimate_tokens
from activities.llm.sources import extract_code
from activities.llm.tools import TOOLS
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
    assert "# Objective" in text and "Rules: Triton only" in text
    assert "notebook shortened" in text and "idea 0:" in text and "idea 1999" in text  # head and tail kept
    assert small[-1]["role"] == "user" and small[-1]["content"].startswith("Turn 7.")
    assert "Remaining budget: 97 of 100 submissions" in small[-1]["content"]  # the state comes last


def test_the_prompt_starts_the_same_every_turn_and_turn_one_has_code(store):
    from workflows.contracts import BestRef

    first = build_messages(req(store, problem="kda", turn=1, used=Used()), store)
    assert "def run(" in first[1]["content"] and "# The starting kernel" in first[1]["content"]
    assert "Work at B1 T8192 H32 D128 (B=1, T=8192, H=32, D=128, state=0): 47.96 GFLOP" in first[1]["content"]
    best = BestRef(candidate_id="c" * 16, source_key=store.put_text(softmax_kernel(**LADDER[3])), speedup=1.2,
                   time_ms=0.8, baseline_ms=0.96, iteration=4, deciding_dist="strong")
    later = build_messages(req(store, problem="kda", turn=9, used=Used(iterations=4, turns=8), best=best,
                               hints=["try BT=32"]), store)
    assert later[:2] == first[:2]  # system and the stable part: identical, so a provider can cache them
    assert "Current best: cccc" in later[-1]["content"] and "try BT=32" in later[-1]["content"]
    # what a new best must beat: the worst speedup, and where the best has it
    assert "1.200x the baseline on strong, its worst input distribution" in later[-1]["content"]


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
        {"id": "a", "name": "submit_kernel", "arguments": '{"source": ' + json.dumps(src) +
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


def kda_conversation(store, n_turns: int):
    """n_turns of a KDA run in the artifact store: each turn submits a full-size variant of the template
    and reads the template whole; returns (head key, the pending answers to the last turn)."""
    import json

    from activities.search import candidate_id
    from baselines.registry import get_problem
    from workflows.contracts import ToolResult

    template = (get_problem("kda").folder / "kernel.py").read_text()
    head, prev_results = None, []
    for t in range(1, n_turns + 1):
        src = template.replace("def run(", f"# variant {t}\ndef run(", 1)
        calls = [{"id": f"s{t}", "name": "submit_kernel", "arguments": json.dumps({"source": src, "rationale": f"v{t}"})},
                 {"id": f"r{t}", "name": "read_starting_kernel", "arguments": "{}"}]
        parsed = [{"call_id": f"s{t}", "name": "submit_kernel", "candidate_id": candidate_id(src)},
                  {"call_id": f"r{t}", "name": "read_starting_kernel"}]
        head = store.put_json({"kind": "llm-turn", "prev": head, "turn": t, "results": prev_results, "hints": [],
                               "assistant": {"content": f"Turn {t}: trying variant {t}.", "tool_calls": calls},
                               "calls": parsed, "feedback": ""})
        read = store.put_text(f"# kda/kernel.py lines 1-{template.count(chr(10))} of {template.count(chr(10))}\n"
                              + template)
        prev_results = [ToolResult(call_id=f"s{t}", name="submit_kernel", content=f"iteration {t}: passed, 1.01x"
                                   ).model_dump(mode="json"),
                        ToolResult(call_id=f"r{t}", name="read_starting_kernel", content_key=read).model_dump(mode="json")]
    return head, [ToolResult.model_validate(r) for r in prev_results], template


def test_kda_prompt_at_turn_50_keeps_three_turns_and_the_template_whole(store):
    from workflows.contracts import BestRef

    head, pending, template = kda_conversation(store, 50)
    best_key = store.put_text(template)
    best = BestRef(candidate_id="b" * 16, source_key=best_key, speedup=1.05, time_ms=1.4, baseline_ms=1.47,
                   iteration=7)
    r = req(store, problem="kda", turn=51, conversation_key=head, tool_results=pending, best=best)
    msgs = build_messages(r, store)
    assert estimate_tokens(msgs) + estimate_tokens(TOOLS) <= 24000
    assert sum(m["role"] == "assistant" for m in msgs) >= 3  # beside the ~23 KB template, read whole
    last_read = [m for m in msgs if m["role"] == "tool"][-1]["content"]
    assert template.rstrip() in last_read  # the latest answer: the template whole
    # older turns name their kernels by candidate id instead of repeating them
    older = [m for m in msgs if m["role"] == "assistant"][:-1]
    assert all("candidate_id=" in m["tool_calls"][0]["function"]["arguments"] for m in older)
    # ... and a short diff against the starting kernel says what each was
    args = [json.loads(m["tool_calls"][0]["function"]["arguments"]).get("source", "") for m in older]
    assert any("against the starting kernel:" in a or "identical to the starting kernel" in a for a in args), args[:1]

    small = build_messages(r.model_copy(update={"context_tokens": 8000}), store)
    assert estimate_tokens(small) + estimate_tokens(TOOLS) <= 8000
    assert small[-1]["content"].startswith("Turn 51.")
    assert any("iteration 50: passed" in (m.get("content") or "") for m in small)  # the last step is kept
    # too small for the ~23 KB best kernel in full: it is named as what it is against the starting kernel
    assert any("identical to the starting kernel (read_starting_kernel shows it)" in (m.get("content") or "")
               for m in small)


def test_a_replayed_kernel_reference_sent_back_names_that_kernel(store):
    ref = "[kernel 0123456789abcdef: 64 lines, sent in full at the time; candidate_id=0123456789abcdef names it]"
    reply = Reply(content="", tool_calls=[
        {"id": "a", "name": "compile", "arguments": json.dumps({"source": ref})},
        {"id": "b", "name": "submit_kernel", "arguments": json.dumps({"source": ref, "rationale": "r"})}])
    (compile_call, submit_call), _ = parse_calls(reply, 3, "softmax", store)
    assert compile_call.candidate_id == "0123456789abcdef" and compile_call.source_key is None
    assert compile_call.error is None
    assert "not a module" in submit_call.error


def test_an_older_kernel_replays_as_a_short_diff_that_names_it_when_sent_back(store):
    from activities.llm.history import DIFF_LINES, _compact_source, short_diff

    base = softmax_kernel(**LADDER[0])
    changed = base.replace("BLOCK_N", "BLOCK_ROWS")
    diff = short_diff(changed, base)
    assert "-" in diff and "+" in diff and "BLOCK_ROWS" in diff
    assert diff.count("\n") <= DIFF_LINES + 3
    assert short_diff(base, base) == "; identical to the starting kernel"
    placeholder = json.loads(_compact_source(json.dumps({"source": "x = [1][0]\n" + changed}),
                                             {"candidate_id": "0123456789abcdef"}, base))["source"]
    assert placeholder.startswith("[kernel 0123456789abcdef:") and "x = [1][0]" in placeholder
    reply = Reply(content="", tool_calls=[{"id": "a", "name": "compile",
                                           "arguments": json.dumps({"source": placeholder})}])
    (call,), _ = parse_calls(reply, 3, "softmax", store)
    assert call.candidate_id == "0123456789abcdef" and call.error is None  # brackets in the diff too


def test_the_objective_names_the_measured_device_once_known(store):
    from workflows.contracts import DeviceFacts

    facts = DeviceFacts(device="NVIDIA H200", bandwidth_tbps=4.21, matmul_tflops=788.0, floor_ms=0.0977)
    before = build_messages(req(store, problem="kda", turn=1, used=Used()), store)[1]["content"]
    after = build_messages(req(store, problem="kda", turn=2, used=Used(turns=1), device_facts=facts), store)
    assert "GPU: NVIDIA H200" not in before  # nothing invented before the worker has measured it
    text = after[1]["content"]
    assert "GPU: NVIDIA H200; measured ceilings 4.21 TB/s device copy and 788 TFLOP/s bf16 matmul" in text
    assert "floor at those rates is 0.0977 ms" in text and "the worst speedup decides" in text


def test_a_small_context_gets_the_compact_system_prompt_and_4096_tokens_hold_the_first_turn(store):
    from dataclasses import replace

    from activities.llm.context import endpoint_room
    from activities.llm.endpoint import PROFILES, fit_reply
    from activities.llm.prompt import COMPACT_SYSTEM_PROMPT, SYSTEM_PROMPT, fit_prompt, system_prompt
    from rules.torch_ops import TORCH_RULE

    first = req(store, turn=1, iteration=0, used=Used())
    small = fit_reply(replace(PROFILES["llamacpp"], context_tokens=4096), False)  # Ollama's default context
    msgs = fit_prompt(first, store, small, 0, "native")
    assert msgs[0]["content"] == COMPACT_SYSTEM_PROMPT and "# The starting kernel" in msgs[1]["content"]
    # the full rules would not have let this first prompt fit beside the 1,024-token reply cap
    full = build_messages(first, store, "native", budget=0)
    assert full[0]["content"] == SYSTEM_PROMPT and estimate_tokens(full) > endpoint_room(small, 0, "native")
    assert estimate_tokens(msgs) <= endpoint_room(small, 0, "native")
    assert estimate_tokens(COMPACT_SYSTEM_PROMPT) * 2 < estimate_tokens(SYSTEM_PROMPT)
    for rule in ("third-party kernel libraries", "torch only allocates", "imports of torch, triton"):
        assert rule in COMPACT_SYSTEM_PROMPT
    # at the llamacpp profile's own 16,384 tokens (and with the context unknown) the rules stay in full
    for s in (PROFILES["llamacpp"], PROFILES["auto"]):
        assert TORCH_RULE in fit_prompt(first, store, s, 0, "native")[0]["content"]
    text = system_prompt("text", compact=True)  # the text tool mode keeps its protocol
    assert text.startswith(COMPACT_SYSTEM_PROMPT.rsplit("\n\n", 1)[0]) and "TOOL: <name>" in text
