"""Past turns replayed in a prompt: each reply with its answers, older kernels by candidate id and a
short diff, tool answers cut to a size."""

from __future__ import annotations

import difflib
import json
import re

from workflows.artifacts import ArtifactStore, ArtifactStoreError, candidate_id
from workflows.contracts import ToolResult
from activities.llm.sources import FENCE, clean_source
from activities.llm.tools import RANGE_TOOLS, text_tool_calls


def load_turns(store: ArtifactStore, head: str | None, n: int) -> list[dict]:
    out = []
    key = head
    while key and len(out) < n:
        entry = store.get_json(key)
        out.append(entry)
        key = entry.get("prev")
    return list(reversed(out))


def result_text(r: dict | ToolResult, store: ArtifactStore, limit: int) -> str:
    r = r if isinstance(r, ToolResult) else ToolResult.model_validate(r)
    text = r.content
    if r.content_key:
        try:
            text = store.get_text(r.content_key)
        except ArtifactStoreError:
            text = r.content or "(content no longer in the artifact store)"
    if len(text) > limit:
        shown = text[:limit]
        more = f"{len(text) - limit} more characters"
        if r.name in RANGE_TOOLS:
            header = re.match(r"# \S+ lines (\d+)-", text)
            first = int(header.group(1)) if header else 1
            next_line = first + shown.count("\n") - 1  # the header line is not a file line
            more += f"; read on with start_line={max(first, next_line)}"
        else:
            more += "; ask again for a narrower view"
        text = shown + f"\n...[{more}]"
    return ("ERROR: " + text) if r.error else text


_PLACEHOLDER = "[kernel {cid}: {lines} lines, sent in full at the time; candidate_id={cid} names it{diff}]"
DIFF_LINES = 12  # changed lines shown per replayed kernel


def short_diff(source: str, base: str | None) -> str:
    """The kernel's changes against the starting kernel, at most DIFF_LINES changed lines: what an older
    turn's kernel was, without its whole source."""
    if not base:
        return ""
    changed = [ln for ln in difflib.unified_diff(base.splitlines(), source.splitlines(), lineterm="", n=0)
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    if not changed:
        return "; identical to the starting kernel"
    shown = "\n".join(changed[:DIFF_LINES])
    more = f"\n... {len(changed) - DIFF_LINES} more changed lines" if len(changed) > DIFF_LINES else ""
    return f"; against the starting kernel:\n{shown}{more}\n"


REPLY_CHARS = 2400  # a compacted turn's prose and unreadable arguments, at most


def _cut(text: str, what: str) -> str:
    if len(text) <= REPLY_CHARS:
        return text
    return text[:REPLY_CHARS] + f"...[{len(text) - REPLY_CHARS} more characters of this {what} not shown]"


def _compact_source(args_json: str, call: dict | None, base: str | None = None) -> str:
    """A replayed call's arguments with its kernel source replaced by the candidate id and a short diff
    against the starting kernel (older turns); long arguments that are not JSON (a reply cut off at its
    limit) as their start, in a JSON object."""
    try:
        args = json.loads(args_json)
    except json.JSONDecodeError:
        if len(args_json) <= REPLY_CHARS:
            return args_json
        return json.dumps({"unreadable_arguments": _cut(args_json, "call's arguments, which are not valid JSON")})
    if not isinstance(args, dict) or not isinstance(args.get("source"), str) or not call or not call.get("candidate_id"):
        return args_json
    src = args["source"]
    args["source"] = _PLACEHOLDER.format(cid=call["candidate_id"], lines=src.count("\n") + 1,
                                         diff=short_diff(src, base))
    return json.dumps(args)


def _compact_fences(content: str, base: str | None = None) -> str:
    def sub(m):
        code = m.group(2)
        if not re.search(r"^def run\(", code, re.M):
            return m.group(0)
        return _PLACEHOLDER.format(cid=candidate_id(clean_source(code)), lines=code.count("\n"),
                                   diff=short_diff(code, base))
    return FENCE.sub(sub, content)


#: a tool message's content where the answers follow in a user message (answers_in_user)
ANSWER_MOVED = "(the answer is in the next user message)"


def history_units(turns: list[dict], pending: list[ToolResult], store: ArtifactStore, limit: int,
                   mode: str = "native", last_limit: int | None = None, base: str | None = None,
                   latest_full: bool = True, answers_in_user: bool = False) -> list[list[dict]]:
    """Each past turn as a unit of messages: the assistant reply, then its answers (as tool messages,
    or in text mode one user message; `answers_in_user`: tool messages that point to one user message
    holding the answers, for servers that drop a tool message's content). Reasoning is never replayed;
    kernel sources are replayed in full only for the latest turn (not even there without latest_full),
    older ones by candidate id."""
    units = []
    for i, t in enumerate(turns):
        lim = (last_limit or limit) if i == len(turns) - 1 else limit
        latest = i == len(turns) - 1 and latest_full
        answers = [ToolResult.model_validate(r) for r in turns[i + 1]["results"]] if i + 1 < len(turns) \
            else list(pending)
        by_id = {r.call_id: r for r in answers}
        a = t["assistant"]
        calls = a.get("tool_calls") or []
        parsed = {c.get("call_id"): c for c in t.get("calls") or []}
        content = a.get("content") or ""
        if mode == "text":
            body = content if latest else _cut(_compact_fences(content, base), "reply")
            if calls and not a.get("calls_from_text"):
                body += "".join(f"\nTOOL: {c['name']} " + (c["arguments"] if latest else
                                _compact_source(c["arguments"], parsed.get(c["id"]), base)) for c in calls)
            unit = [{"role": "assistant", "content": body.strip() or "(empty reply)"}]
            texts = [_answer_text(c, n, by_id, store, lim) for n, c in enumerate(calls, 1)]
        else:
            if a.get("calls_from_text"):
                content = text_tool_calls(content)[1]
            msg: dict = {"role": "assistant", "content": content if latest else _cut(_compact_fences(content, base),
                                                                                      "reply")}
            if calls:
                msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"], "arguments": c["arguments"] if latest else
                                                   _compact_source(c["arguments"], parsed.get(c["id"]), base)}}
                                     for c in calls]
            unit = [msg]
            for c in calls:
                r = by_id.get(c["id"])
                unit.append({"role": "tool", "tool_call_id": c["id"], "content": ANSWER_MOVED if answers_in_user
                             else result_text(r, store, lim) if r else "(no result recorded)"})
            texts = [_answer_text(c, n, by_id, store, lim) for n, c in enumerate(calls, 1)] if answers_in_user else []
        implicit = [r for r in answers if r.implicit]
        texts += [result_text(r, store, lim) for r in implicit] + ([t["feedback"]] if t.get("feedback") else [])
        if texts:
            unit.append({"role": "user", "content": "\n\n".join(texts)})
        units.append(unit)
    return units


def _answer_text(call: dict, n: int, by_id: dict, store: ArtifactStore, limit: int) -> str:
    """One call's answer as a user message shows it."""
    r = by_id.get(call["id"])
    return f"## Result of {call['name']} (call {n})\n" + (result_text(r, store, limit) if r else "(no result recorded)")
