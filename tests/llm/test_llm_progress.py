"""A weak or stuck model makes progress or stops cleanly: a call failing the same way again is answered with
what to do instead, a model that does not submit is offered only submit_kernel, and turns that bring nothing
new end the run as exhausted with the reason (workflows/llm_progress.py; whole runs on the dev server)."""

from __future__ import annotations

from tests.llm.kernels import LADDER, softmax_kernel
from tests.llm.script import TurnScript, turn
from tests.llm.server import ChatServer
from tests.workflows.helpers import start, workers
from workflows import llm_progress as lp
from workflows.contracts import LlmProgress, RunSpec, ToolCall, ToolResult


def submit(i: int):
    return ("submit_kernel", {"source": softmax_kernel(**LADDER[i]), "rationale": f"step {i}"})


BROKEN = ("submit_kernel", {"source": softmax_kernel(**LADDER[0]).replace("def run(", "def run(:\n", 1),
                            "rationale": "first try"})


def tool_names(seen) -> list[str]:
    return [t["function"]["name"] for t in seen.body.get("tools", [])]


def answers(seen) -> list[str]:
    msgs = seen.body["messages"]
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    return [m["content"] for m in msgs[last + 1:] if m["role"] == "tool"]


def test_the_same_failing_call_is_answered_with_what_to_do_instead():
    p = LlmProgress()
    call = ToolCall(call_id="a", name="compile", error="compile needs `source` (a complete module) or "
                                                      "`candidate_id` (a kernel seen before)")
    failed = ToolResult(call_id="a", name="compile", content=call.error, error=True)
    for _ in range(lp.REPEAT_LIMIT - 1):
        assert not lp.is_repeat(p, call)
        lp.note_result(p, call, failed)
    assert lp.is_repeat(p, call)
    text = lp.repeat_answer(call, p)
    assert f"{lp.REPEAT_LIMIT} times in a row" in text and "give compile the complete module in `source`" in text
    other = call.model_copy(update={"name": "check", "error": "check needs `source`"})
    assert not lp.is_repeat(p, other)  # another call is run
    lp.note_result(p, call, failed)
    assert lp.narrow_reason(p, 1, 30) == f"the same call failed {lp.REPEAT_LIMIT} times in a row"
    lp.note_result(p, call, ToolResult(call_id="b", name="compile", content="compiled"))
    assert p.failing_times == 0 and lp.narrow_reason(p, 1, 30) == ""
    assert lp.narrow_reason(p, lp.narrow_after(30), 30) == "8 turns without a new submission"


def test_stalled_turns_end_the_run_with_a_reason():
    p = LlmProgress()
    for n in range(1, lp.STALLED_TURNS_EXHAUST):
        assert not lp.note_turn(p, submitted=False, executed=True, submit_only="3 turns without a new submission",
                                had_calls=True)
        assert p.stalled == n
    assert lp.note_turn(p, submitted=False, executed=False, submit_only="x", had_calls=True)
    assert "nothing new in 6 turns in a row" in p.stop_reason and "failed the same way" in p.stop_reason
    assert "kept failing" not in p.stop_reason  # no failing call to name
    q = LlmProgress(stalled=4)
    assert not lp.note_turn(q, submitted=True, executed=True, submit_only="x", had_calls=True) and q.stalled == 0
    assert not lp.note_turn(q, submitted=False, executed=True, submit_only="", had_calls=True) and q.stalled == 0


async def test_a_model_calling_compile_without_source_over_and_over_stops_cleanly(env, store, llm_env):
    script = TurnScript([turn(BROKEN)] + [turn(("compile", {})) for _ in range(30)])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 10}),
                            "llm-stuck")
            res = await h.result()
        turns = server.turns()
    assert res.stopped_by == "exhausted" and res.iterations == 1
    assert len(turns) == res.used.turns == 9  # not the 30 turns the model would have gone on for
    assert "brought nothing new in 6 turns in a row" in res.stop_reason, res.stop_reason
    assert "only submit_kernel was offered" in res.stop_reason and "kept failing with: not run" in res.stop_reason
    # the third identical call is not run again: it is answered with what to do instead
    (third,) = answers(turns[4])
    assert "you made this exact call (`compile {}`) 3 times in a row" in third
    assert "give compile the complete module in `source`" in third
    # from then on only the submission is offered, and the prompt says so
    assert [len(tool_names(s)) for s in turns[:4]] == [11] * 4
    assert all(tool_names(s) == ["submit_kernel"] for s in turns[4:])
    forced = {"type": "function", "function": {"name": "submit_kernel"}}  # required, in the form more servers take
    assert all(s.body.get("tool_choice") == forced for s in turns[4:])
    assert all(s.body.get("tool_choice") == "auto" for s in turns[:4])
    assert "Only submit_kernel is open this turn" in turns[4].body["messages"][-1]["content"]
    assert "only submit_kernel is open now" in answers(turns[5])[0]


def test_turns_repeating_the_answered_calls_of_the_turn_before_narrow_the_offer():
    p = LlmProgress()
    read = [ToolCall(call_id="a", name="read_baseline")]
    ok = [ToolResult(call_id="a", name="read_baseline", content="# softmax/baseline.py lines 1-7 of 7")]
    assert lp.repeats_answered(p, read, ok) == ""  # the first read is new
    lp.note_answered(p, read, ok, "")
    assert lp.repeats_answered(p, read, ok) == "`read_baseline {}`"
    ranged = [read[0].model_copy(update={"args": {"start_line": 3}})]
    assert lp.repeats_answered(p, ranged, ok) == ""  # another part of the file
    failed = [ok[0].model_copy(update={"error": True})]
    assert lp.repeats_answered(p, read, failed) == ""  # failures have their own count
    lp.note_answered(p, read, ok, "`read_baseline {}`")
    assert lp.narrow_reason(p, 2, 30) == ""
    lp.note_answered(p, read, ok, "`read_baseline {}`")
    assert lp.narrow_reason(p, 3, 30) == "2 turns in a row only made the calls of the turn before again"
    assert p.stalled == 0  # the answers were real: not counted toward exhaustion
    lp.note_answered(p, read, [failed[0]], "", held=True)  # narrowed, no submission: still narrowed
    assert lp.narrow_reason(p, 4, 30) != ""
    lp.note_answered(p, ranged, ok, "")
    assert p.repeating == 0 and lp.narrow_reason(p, 4, 30) == ""


async def test_a_model_reading_one_file_over_and_over_is_narrowed_and_stops(env, store, llm_env):
    script = TurnScript([turn(("read_baseline", {})) for _ in range(30)])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 3}),
                            "llm-rereading")
            res = await h.result()
        turns = server.turns()
    # narrowed after two turns that only read the file again, not after the 8 turns without a submission,
    # then stopped after 6 narrowed turns without one
    assert [len(tool_names(s)) for s in turns[:3]] == [11] * 3
    assert all(tool_names(s) == ["submit_kernel"] for s in turns[3:])
    assert "only made the calls of the turn before again" in turns[3].body["messages"][-1]["content"]
    assert res.stopped_by == "exhausted" and res.iterations == 0
    assert len(turns) == res.used.turns == 9, len(turns)
    assert "brought nothing new in 6 turns in a row" in res.stop_reason, res.stop_reason


async def test_a_narrowed_model_that_submits_gets_every_tool_back(env, store, llm_env):
    script = TurnScript([turn(submit(0))] + [turn(("compile", {})) for _ in range(3)]
                        + [turn(submit(1)), turn(("read_baseline", {})), turn(submit(2))])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 3}),
                            "llm-narrowed")
            res = await h.result()
        turns = server.turns()
    assert res.stopped_by == "budget-iterations" and res.iterations == 3 and len(turns) == 7
    assert tool_names(turns[4]) == ["submit_kernel"]  # narrowed after the third identical failure
    assert len(tool_names(turns[5])) == 11 and "Only submit_kernel" not in turns[5].body["messages"][-1]["content"]
