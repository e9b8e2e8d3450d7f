"""A reply's tool calls as ToolCalls: arguments checked, kernel sources stored and replaced by their keys,
a reply with code and no call taken as a submission."""

from __future__ import annotations

import json
import re

from baselines.external.file import ExternalProblem
from baselines.external.model_new import entry_source
from baselines.problem import ProblemFileError
from baselines.registry import get_problem
from workflows.artifacts import ArtifactStore, candidate_id
from workflows.contracts import ToolCall
from activities.llm.replies import Reply
from activities.llm.sources import clean_source, extract_code
from activities.llm.tools import SOURCE_TOOLS, TOOL_NAMES

MAX_CALLS_PER_TURN = 8


def _entry_form(source: str, problem: str) -> str:
    """A problem file's candidate in the entry-function form the harness calls (a `ModelNew` class is
    accepted too, as in KernelBench); built-in problems' candidates as they are."""
    p = get_problem(problem)
    if not isinstance(p, ExternalProblem):
        return source
    try:
        return entry_source(source, p)
    except ProblemFileError:  # the rules and the harness name what is wrong with it
        return source


def _rules(source: str, problem: str) -> str | None:
    try:
        from rules.check import check_source
    except ImportError:
        return None
    rep = check_source(source, problem)
    return None if rep.ok else f"{rep.rule}: {rep.detail}"


def parse_calls(reply: Reply, turn: int, problem: str, store: ArtifactStore,
                seen: dict[str, str] | None = None, submit_only: str = "") -> tuple[list[ToolCall], str]:
    """The reply's tool calls as ToolCalls (sources stored, arguments checked), or an implicit
    submission when the reply has code but no tool call, or feedback when it has neither. `seen` maps
    candidate ids evaluated in earlier runs to what came of them: submitting one again is answered.
    `submit_only` set (why): every tool but submit_kernel is answered as closed, not run."""
    out: list[ToolCall] = []
    cut = reply.finish_reason == "length"
    for i, tc in enumerate(reply.tool_calls):
        cid = tc["id"]
        name = tc["name"]
        if i >= MAX_CALLS_PER_TURN:
            out.append(ToolCall(call_id=cid, name=name or "?", error=f"not executed: at most "
                                f"{MAX_CALLS_PER_TURN} tool calls per turn"))
            continue
        if name not in TOOL_NAMES:
            out.append(ToolCall(call_id=cid, name=name or "?", error=f"unknown tool {name!r}; the tools "
                                f"are: {', '.join(sorted(TOOL_NAMES))}"))
            continue
        if submit_only and name != "submit_kernel":
            out.append(ToolCall(call_id=cid, name=name, error=f"not run: only submit_kernel is open now "
                                f"({submit_only}); submit a complete module (`source`) with a `rationale`. The "
                                f"other tools open again once a submission is recorded."))
            continue
        raw = tc["arguments"].strip() or "{}"
        try:
            args = json.loads(raw, strict=False)  # raw newlines in a string: llama-cpp-python's grammar allows them
        except json.JSONDecodeError as e:
            if cut:
                out.append(ToolCall(call_id=cid, name=name, error="your reply was cut off at the reply limit "
                                    "before this call's arguments were complete; send a shorter reply (fewer "
                                    "calls, less prose, a more compact kernel)"))
                continue
            out.append(ToolCall(call_id=cid, name=name, error=f"the arguments are not valid JSON "
                                f"({e.msg} at line {e.lineno} column {e.colno}); send a JSON object, with "
                                f"newlines and quotes in the source escaped"))
            continue
        if not isinstance(args, dict):
            out.append(ToolCall(call_id=cid, name=name, error="the arguments must be a JSON object"))
            continue
        out.append(_duplicate(_source_call(cid, name, args, problem, store), seen))
    if out:
        return out, _cut_note(reply) if cut else ""
    code = extract_code(reply.content)
    if code:
        call = _source_call(f"text_{turn}", "submit_kernel",
                            {"source": code, "rationale": "code in a reply without a tool call"}, problem, store)
        return [_duplicate(call.model_copy(update={"implicit": True}), seen)], _cut_note(reply) if cut else ""
    if cut:
        return [], _cut_note(reply) + " Nothing was run."
    return [], ("Your reply had no tool call and no kernel code, so nothing was run. Call a tool: "
                "submit_kernel with a complete module, or compile/check/benchmark/profile/read_* first.")


def _cut_note(reply: Reply) -> str:
    return (f"Your last reply was cut off at the reply limit ({reply.tokens_out} tokens) before it was "
            f"complete. Keep replies shorter: one kernel per reply, little prose.")


def _duplicate(call: ToolCall, seen: dict[str, str] | None) -> ToolCall:
    if call.name != "submit_kernel" or call.error or not seen or call.candidate_id not in seen:
        return call
    return call.model_copy(update={"error": f"this exact source was already evaluated: {seen[call.candidate_id]}. "
                                            f"Change something before submitting again."})


_REFERENCE = re.compile(r"^\s*\[kernel ([0-9a-f]{16}): .*\]\s*$", re.S)  # the placeholder, its diff included


def _source_call(cid: str, name: str, args: dict, problem: str, store: ArtifactStore) -> ToolCall:
    small = {k: (v[:300] if isinstance(v, str) else v) for k, v in args.items() if k != "source"}
    src = args.get("source")
    ref = _REFERENCE.match(src) if isinstance(src, str) else None
    if ref:  # the replay's stand-in for an older kernel, sent back: it names that kernel
        if name == "submit_kernel":
            return ToolCall(call_id=cid, name=name, args=small, error=f"`source` is the reference "
                            f"{src.strip()[:80]}, not a module: submit the complete module")
        args, src = {**args, "candidate_id": ref.group(1)}, None
        small["candidate_id"] = ref.group(1)
    if name == "submit_kernel" and not isinstance(src, str):
        return ToolCall(call_id=cid, name=name, args=small,
                        error="submit_kernel needs `source` (the complete module as a string) and `rationale`")
    if name in SOURCE_TOOLS and name != "submit_kernel" and src is None and not args.get("candidate_id"):
        if name == "diff_against_best":
            return ToolCall(call_id=cid, name=name, args=small, error="give `source` or `candidate_id`")
        return ToolCall(call_id=cid, name=name, args=small,
                        error=f"{name} needs `source` (a complete module) or `candidate_id` (a kernel seen before)")
    if isinstance(src, str):
        source = _entry_form(clean_source(src), problem)
        if not source.strip():
            return ToolCall(call_id=cid, name=name, args=small, error="`source` is empty")
        key = store.put_text(source)
        return ToolCall(call_id=cid, name=name, args=small, source_key=key, candidate_id=candidate_id(source),
                        rules_error=_rules(source, problem))
    if src is not None:
        return ToolCall(call_id=cid, name=name, args=small, error="`source` must be a string")
    cand = args.get("candidate_id")
    return ToolCall(call_id=cid, name=name, args=small, candidate_id=str(cand) if cand else None)
