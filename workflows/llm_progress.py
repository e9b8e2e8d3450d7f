"""Policy `llm`: whether the model is getting anywhere, and what the loop does when it is not.

Plain functions of the carried `LlmProgress`, used by the deterministic loop (workflows/llm_loop.py):
- the same call failing the same way REPEAT_LIMIT times in a row is not run again: it is answered with
  what to do instead;
- after turns without a submission (NARROW_AFTER, or a repeated failure, or stalled turns, or turns that
  only made the answered calls of the turn before again) only submit_kernel is offered, until an
  iteration is recorded;
- a turn that brings nothing new (no call, only repeats, or no submission when only submit_kernel was
  offered) is stalled; STALLED_TURNS_EXHAUST in a row end the run as `exhausted`, with the reason.
"""

from __future__ import annotations

import json

from workflows.contracts import CallView, LlmProgress, ToolCall, ToolResult, TurnView
from workflows.text import clip

REPEAT_LIMIT = 3  # the same failing call this many times in a row: answered, not run again
STALLED_TURNS_EXHAUST = 6  # turns in a row that bring nothing new: the model has given up
STALLED_TURNS_NARROW = 2  # stalled turns in a row after which only submit_kernel is offered
TURNS_SHOWN = 6  # turns kept for status and watch


def narrow_after(turns_per_iteration: int) -> int:
    """Turns without a recorded iteration after which only submit_kernel is offered: a third of the turn
    budget, between 2 and 8 (a good model submits long before; a stuck one is narrowed well before the
    turn budget ends the run)."""
    return max(2, min(8, turns_per_iteration // 3))


def signature(call: ToolCall) -> str:
    """What makes two calls the same call: the tool, its arguments (a rationale aside), the kernel it names."""
    args = {k: v for k, v in call.args.items() if k != "rationale"}
    return json.dumps([call.name, args, call.candidate_id, call.error], sort_keys=True, default=str)


def _shown(call: ToolCall) -> str:
    args = {k: v for k, v in call.args.items() if k != "rationale"}
    if call.candidate_id and "candidate_id" not in args:
        args["candidate_id"] = call.candidate_id
    return f"`{call.name} {json.dumps(args, sort_keys=True)[:120]}`"


def instead(call: ToolCall, answer: str) -> str:
    """What to do instead of repeating a call that keeps failing the same way."""
    if call.name in ("compile", "check", "benchmark", "profile", "diff_against_best") and "needs `source`" in answer:
        return (f"give {call.name} the complete module in `source` (or the candidate_id of a kernel an answer "
                f"named), or call submit_kernel with the complete module: start from the starting kernel "
                f"(read_starting_kernel) and change one thing")
    if call.name == "submit_kernel" and "already evaluated" in answer:
        return "change the kernel before submitting it again: one knob or one idea at a time"
    if call.name == "submit_kernel":
        return "submit a complete module that fixes what the answer names, starting from the starting kernel"
    if "unknown tool" in answer:
        return "call one of the tools the answer lists, or submit_kernel with a complete module"
    return ("fix what the answer names, or do something else: submit_kernel with a complete, changed module "
            "(the starting kernel is a correct one to start from)")


def repeat_answer(call: ToolCall, p: LlmProgress) -> str:
    """The answer to a call made again after failing the same way REPEAT_LIMIT - 1 times: not run."""
    n = p.failing_times + 1
    return (f"not run: you made this exact call ({_shown(call)}) {n} times in a row and it failed every time "
            f"with: {clip(p.failing_answer, 240)}. Making it again will not change the answer. Instead, "
            f"{instead(call, p.failing_answer)}.")


def is_repeat(p: LlmProgress, call: ToolCall) -> bool:
    return p.failing_call == signature(call) and p.failing_times >= REPEAT_LIMIT - 1


def note_result(p: LlmProgress, call: ToolCall, result: ToolResult) -> None:
    """Count a call's answer: a failure like the previous one adds to the streak, anything else starts
    a new one (or ends it)."""
    sig = signature(call)
    if not result.error:
        p.failing_call, p.failing_times, p.failing_answer = "", 0, ""
    elif sig == p.failing_call:
        p.failing_times += 1
    else:
        p.failing_call, p.failing_times, p.failing_answer = sig, 1, clip(result.content, 400)


def repeats_answered(p: LlmProgress, calls: list[ToolCall], results: list[ToolResult]) -> str:
    """The calls, in words, where a turn made only calls that the turn before made and had answered, and
    they were answered again: a model reading one file turn after turn learns nothing new; else ""."""
    if not calls or any(r.error for r in results) or any(signature(c) not in p.answered for c in calls):
        return ""
    return ", ".join(dict.fromkeys(_shown(c) for c in calls))


def note_answered(p: LlmProgress, calls: list[ToolCall], results: list[ToolResult], repeated: str,
                  held: bool = False) -> None:
    """Count a turn that repeated the answered calls of the turn before (`repeated`, repeats_answered) and
    keep this turn's calls that succeeded, for the next turn's. Such turns narrow the offer to
    submit_kernel; they do not count toward exhaustion (the answers were real ones). `held`: a narrowed
    turn that submitted nothing keeps the count (the narrowing holds until a submission)."""
    p.repeating = p.repeating + 1 if repeated else (p.repeating if held else 0)
    p.answered = [signature(c) for c, r in zip(calls, results) if not r.error]


def narrow_reason(p: LlmProgress, turns_since_submission: int, turns_per_iteration: int) -> str:
    """Why only submit_kernel is offered next turn, or "" (every tool is)."""
    if p.failing_times >= REPEAT_LIMIT:
        return f"the same call failed {p.failing_times} times in a row"
    if p.stalled >= STALLED_TURNS_NARROW:
        return f"{p.stalled} turns in a row brought nothing new"
    if p.repeating >= STALLED_TURNS_NARROW:
        return f"{p.repeating} turns in a row only made the calls of the turn before again"
    if turns_since_submission >= narrow_after(turns_per_iteration):
        return f"{turns_since_submission} turns without a new submission"
    return ""


def note_turn(p: LlmProgress, *, submitted: bool, executed: bool, submit_only: str, had_calls: bool) -> bool:
    """Count one turn; True when the run should end as exhausted (p.stop_reason then says why)."""
    if submitted:
        p.stalled, p.last_stall = 0, ""
        return False
    if not had_calls:
        stall = "a reply with no tool call and no kernel code"
    elif not executed:
        stall = "only calls that had failed the same way before"
    elif submit_only:
        stall = f"no submission although only submit_kernel was offered ({submit_only})"
    else:
        p.stalled, p.last_stall = 0, ""
        return False
    p.stalled += 1
    p.last_stall = stall
    if p.stalled < STALLED_TURNS_EXHAUST:
        return False
    p.stop_reason = (f"the model brought nothing new in {p.stalled} turns in a row; the last one: {stall}"
                     + (f"; its calls kept failing with: {clip(p.failing_answer, 200)}" if p.failing_answer else ""))
    return True


# ---- what status and watch show ----------------------------------------------------------------------------

def turn_asked(p: LlmProgress, turn: int, now: float, submit_only: bool) -> None:
    p.turns = (p.turns + [TurnView(turn=turn, asked_at=now, submit_only=submit_only)])[-TURNS_SHOWN:]


def turn_replied(p: LlmProgress, turn: int, tokens_in: int, tokens_out: int, calls: list[ToolCall],
                 note: str) -> None:
    for v in p.turns:
        if v.turn == turn:
            v.replied, v.tokens_in, v.tokens_out = True, tokens_in, tokens_out
            v.calls = [CallView(name=c.name) for c in calls]
            v.note = clip(note, 200)


def call_answered(p: LlmProgress, turn: int, index: int, result: ToolResult) -> None:
    for v in p.turns:
        if v.turn == turn and index < len(v.calls):
            v.calls[index].verdict = clip(result.content, 160) or "done"
            v.calls[index].error = result.error
