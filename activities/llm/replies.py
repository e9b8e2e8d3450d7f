"""A Chat Completions reply, whatever shape the endpoint gives it, as one Reply."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from temporalio.exceptions import ApplicationError

from activities.llm.endpoint import Endpoint
from activities.llm.tools import text_tool_calls


@dataclass
class Reply:
    content: str
    tool_calls: list[dict] = field(default_factory=list)  # {"id", "name", "arguments"} (arguments: str)
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    model: str = ""
    finish_reason: str = ""
    reasoning: str = ""  # <think> text or reasoning_content: recorded, never replayed to the model
    calls_from_text: bool = False  # the tool calls were written in the reply's text, not sent natively
    adapted: dict = field(default_factory=dict)  # what the run has learned about the endpoint, so far
    learned: list[str] = field(default_factory=list)  # adaptations made during this request, one line each
    mode: str = "native"  # the tool mode the request was sent in
    tools_seen: object | None = None  # probe.ToolsSeen, where the endpoint was probed for dropped tools


def estimate_tokens(obj) -> int:
    text = obj if isinstance(obj, str) else json.dumps(obj)
    return len(text) // 4 + 1


def _text_of(content) -> str:
    """Message content as text: a string, or a list of parts ({"type": "text", "text": ...})."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if isinstance(p, str):
                out.append(p)
            elif isinstance(p, dict) and p.get("type") in (None, "text", "output_text") and isinstance(p.get("text"), str):
                out.append(p["text"])
        return "".join(out)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return content["text"]
    return str(content)


_THINK = re.compile(r"<(think|thinking|reasoning)>(.*?)</\1>\s*", re.S | re.I)


def split_reasoning(content: str) -> tuple[str, str]:
    """(content without its reasoning, the reasoning): <think> blocks, and a leading block whose opening
    tag the chat template wrote (the reply then starts inside it and only closes it)."""
    reasoning = [m.group(2).strip() for m in _THINK.finditer(content)]
    content = _THINK.sub("", content)
    m = re.match(r"(?s)(.*?)</(think|thinking|reasoning)>\s*", content)
    if m and "<" + m.group(2) not in m.group(1):
        reasoning.append(m.group(1).strip())
        content = content[m.end():]
    return content.strip(), "\n\n".join(r for r in reasoning if r)


def normalise(data: dict, messages: list[dict], ep: Endpoint) -> Reply:
    """A Chat Completions reply as a Reply, whatever its shape: content as text or parts, arguments as
    a string or an object, reasoning in its own field or in <think> tags, tool calls native or written
    in the text, usage present or not. Only a reply without choices is an error (choices in a shape none
    is read from, a reply garbled on its way, may be transient; JSON that is no Chat Completions reply at
    all never reaches here: chat._raw_json)."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ApplicationError(f"{ep.where()}: the reply has no choices", type="LLMServerError")
    choice = choices[0]
    msg = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content, reasoning = split_reasoning(_text_of(msg.get("content")))
    extra = _text_of(msg.get("reasoning_content") or msg.get("reasoning"))
    reasoning = "\n\n".join(x for x in (extra.strip(), reasoning) if x)
    calls = []
    for i, tc in enumerate(msg.get("tool_calls") or []):
        if not isinstance(tc, dict):
            continue
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
        args = fn.get("arguments", tc.get("arguments"))
        if args is None:
            args = ""
        elif not isinstance(args, str):
            args = json.dumps(args)
        cid = str(tc.get("id") or f"call_{i}")
        if any(c["id"] == cid for c in calls):  # answers are matched by id: each must be unique
            cid = f"{cid}_{i}"
        calls.append({"id": cid, "name": str(fn.get("name") or tc.get("name") or ""), "arguments": args})
    from_text = False
    if not calls:
        calls, content = text_tool_calls(content)
        from_text = bool(calls)
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}

    def count(k, fallback):
        v = usage.get(k)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else fallback

    tin = count("prompt_tokens", estimate_tokens(messages))
    tout = count("completion_tokens", estimate_tokens(content + reasoning + json.dumps(calls)))
    return Reply(content=content, tool_calls=calls, tokens_in=tin, tokens_out=tout,
                 model=str(data.get("model") or ep.model), finish_reason=str(choice.get("finish_reason") or ""),
                 reasoning=reasoning, calls_from_text=from_text)
