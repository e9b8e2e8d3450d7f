"""Whether the tool schemas, and the tools' answers, reach the model. Some servers take `tools` and drop
them without a word (llama-cpp-python's server when the request has no tool_choice, or when its chat
format has no function calling): the model never sees a tool, and no error says so. Some render a tool
message without its content (llama-cpp-python's chatml-function-calling): the model never sees what a tool
answered. Two one-token requests, with the part and without it, tell each by the prompt tokens the server
counts: what is in the prompt costs tokens."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace

from activities.llm.endpoint import Endpoint, Profile
from activities.llm.replies import estimate_tokens

PROBE_SYSTEM = "Tool schema probe. Reply with OK."
#: a tool answer of about 90 tokens, against "OK"
ANSWER_FILLER = "Answer probe: " + " ".join(f"value {i}" for i in range(40))


@dataclass(frozen=True)
class ToolsSeen:
    seen: bool | None  # None: the endpoint reports no usage (or failed the probe), so it cannot be told
    with_tools: int = 0  # prompt tokens the server counted with the schemas
    without: int = 0  # and without them
    schema_tokens: int = 0  # the schemas' estimated size
    tokens_in: int = 0  # what the two requests cost
    tokens_out: int = 0
    what: str = "a tool schema"  # the part probed

    def describe(self) -> str:
        return (f"{self.with_tools} prompt tokens with {self.what} of about {self.schema_tokens} tokens, "
                f"{self.without} without it")


def counted(with_part: int, without: int, part_tokens: int) -> bool:
    """A server that renders a part into the prompt counts a good part of its size (templates reformat
    it, so not all of it); one that drops it counts the same prompt both times."""
    return with_part - without >= max(16, part_tokens // 10)


def probe_messages() -> list[dict]:
    return [{"role": "system", "content": PROBE_SYSTEM}, {"role": "user", "content": "OK?"}]


def smallest(tools: list[dict]) -> dict:
    """The probe's schema: a server that ignores the reply cap for a call's arguments (llama-cpp-python's
    function calling does) writes little for a tool without parameters."""
    return min(tools, key=lambda t: len(json.dumps(t)))


def answer_messages(tool: dict, answer: str) -> list[dict]:
    """The probe's exchange with one tool call answered by `answer`."""
    call = {"id": "call_probe", "type": "function", "function": {"name": tool["function"]["name"], "arguments": "{}"}}
    return probe_messages() + [{"role": "assistant", "content": "", "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "call_probe", "content": answer}]


def _probe(s: Profile, requests: list[tuple[list[dict], list[dict] | None]], size: int, what: str, send) -> ToolsSeen:
    """Two requests, without the part and with it, each for one token: whether the part was counted."""
    one = replace(s, reply_tokens=1, tool_mode="native")
    usage = []
    try:
        for messages, tools in requests:
            data = send(messages, tools, one)
            u = data.get("usage") if isinstance(data, dict) else None
            if not isinstance(u, dict) or not isinstance(u.get("prompt_tokens"), int):
                return ToolsSeen(None, what=what)
            usage.append((u["prompt_tokens"], int(u.get("completion_tokens") or 0)))
    except Exception:  # noqa: BLE001 - a probe that fails tells nothing; the turn itself went through
        return ToolsSeen(None, what=what)
    (without, out0), (with_part, out1) = usage
    return ToolsSeen(counted(with_part, without, size), with_part, without, size, with_part + without, out0 + out1,
                     what)


def probe_tools(s: Profile, tools: list[dict], send) -> ToolsSeen:
    """`send(messages, tools or None, settings) -> dict` posts one request the way chat does and returns
    the reply's JSON. One schema is enough (a server renders all or none) and keeps the probe cheap; it
    goes with the tool_choice an ordinary turn sends."""
    tools = [smallest(tools)]
    return _probe(s, [(probe_messages(), None), (probe_messages(), tools)], estimate_tokens(tools), "a tool schema",
                  send)


def probe_answers(s: Profile, tools: list[dict], send) -> ToolsSeen:
    """Whether a tool message's content reaches the model: one answered call, its answer "OK" and then
    ANSWER_FILLER, the tools sent both times."""
    tool = smallest(tools)
    return _probe(s, [(answer_messages(tool, "OK"), [tool]), (answer_messages(tool, ANSWER_FILLER), [tool])],
                  estimate_tokens(ANSWER_FILLER), "a tool answer", send)


_SEEN: dict[tuple, ToolsSeen] = {}  # each probe once per worker process, endpoint and model (and schema)
_SEEN_LOCK = threading.Lock()


def tools_seen(ep: Endpoint, s: Profile, tools: list[dict], send) -> tuple[ToolsSeen, bool]:
    """(the schemas' probe's result, whether it was sent now: its tokens are this request's to count)."""
    return _once((ep.base_url, ep.model, s.tool_choice, smallest(tools)["function"]["name"]),
                 lambda: probe_tools(s, tools, send))


def answers_seen(ep: Endpoint, s: Profile, tools: list[dict], send) -> tuple[ToolsSeen, bool]:
    """(the answers' probe's result, whether it was sent now)."""
    return _once(("answers", ep.base_url, ep.model), lambda: probe_answers(s, tools, send))


def _once(key: tuple, probe) -> tuple[ToolsSeen, bool]:
    with _SEEN_LOCK:
        if key in _SEEN:
            return _SEEN[key], False
    got = probe()
    if got.seen is not None:
        with _SEEN_LOCK:
            _SEEN[key] = got
    return got, True
