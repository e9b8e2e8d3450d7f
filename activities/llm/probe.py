"""Whether the tool schemas reach the model. Some servers take `tools` and drop them without a word
(llama-cpp-python's server when the request has no tool_choice, or when its chat format has no function
calling): the model never sees a tool, and no error says so. Two one-token requests, one tiny message
with the schemas and without them, tell it by the prompt tokens the server counts: schemas in the prompt
cost tokens."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace

from activities.llm.endpoint import Endpoint, Profile
from activities.llm.replies import estimate_tokens

PROBE_SYSTEM = "Tool schema probe. Reply with OK."


@dataclass(frozen=True)
class ToolsSeen:
    seen: bool | None  # None: the endpoint reports no usage (or failed the probe), so it cannot be told
    with_tools: int = 0  # prompt tokens the server counted with the schemas
    without: int = 0  # and without them
    schema_tokens: int = 0  # the schemas' estimated size
    tokens_in: int = 0  # what the two requests cost
    tokens_out: int = 0

    def describe(self) -> str:
        return (f"{self.with_tools} prompt tokens with a tool schema of about {self.schema_tokens} tokens, "
                f"{self.without} without it")


def schemas_counted(with_tools: int, without: int, schema_tokens: int) -> bool:
    """A server that renders the schemas into the prompt counts a good part of their size (templates
    reformat them, so not all of it); one that drops them counts the same prompt both times."""
    return with_tools - without >= max(16, schema_tokens // 10)


def probe_messages() -> list[dict]:
    return [{"role": "system", "content": PROBE_SYSTEM}, {"role": "user", "content": "OK?"}]


def smallest(tools: list[dict]) -> dict:
    """The probe's schema: a server that ignores the reply cap for a call's arguments (llama-cpp-python's
    function calling does) writes little for a tool without parameters."""
    return min(tools, key=lambda t: len(json.dumps(t)))


def probe_tools(s: Profile, tools: list[dict], send) -> ToolsSeen:
    """`send(messages, tools or None, settings) -> dict` posts one request the way chat does and returns
    the reply's JSON. One schema is enough (a server renders all or none) and keeps the probe cheap; it
    goes with the tool_choice an ordinary turn sends."""
    one = replace(s, reply_tokens=1, tool_mode="native")
    tools = [smallest(tools)]
    usage = []
    try:
        for with_tools in (False, True):
            data = send(probe_messages(), tools if with_tools else None, one)
            u = data.get("usage") if isinstance(data, dict) else None
            if not isinstance(u, dict) or not isinstance(u.get("prompt_tokens"), int):
                return ToolsSeen(None)
            usage.append((u["prompt_tokens"], int(u.get("completion_tokens") or 0)))
    except Exception:  # noqa: BLE001 - a probe that fails tells nothing; the turn itself went through
        return ToolsSeen(None)
    (without, out0), (with_tools, out1) = usage
    size = estimate_tokens(tools)
    return ToolsSeen(schemas_counted(with_tools, without, size), with_tools, without, size,
                     with_tools + without, out0 + out1)


_SEEN: dict[tuple, ToolsSeen] = {}  # per endpoint, model and tool_choice: probed once per worker process
_SEEN_LOCK = threading.Lock()


def tools_seen(ep: Endpoint, s: Profile, tools: list[dict], send) -> tuple[ToolsSeen, bool]:
    """(the probe's result, whether it was sent now: its tokens are this request's to count)."""
    key = (ep.base_url, ep.model, s.tool_choice, smallest(tools)["function"]["name"])
    with _SEEN_LOCK:
        if key in _SEEN:
            return _SEEN[key], False
    got = probe_tools(s, tools, send)
    if got.seen is not None:
        with _SEEN_LOCK:
            _SEEN[key] = got
    return got, True
