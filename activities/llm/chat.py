"""One Chat Completions exchange: the request shaped for the endpoint's settings, sent with heartbeats,
refusals that name their fix answered by that change, the reply normalised."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.llm.endpoint import Endpoint, Profile, client_for, config_error, redact
from activities.llm.errors import (FIX_CONFIG, ContextTooSmall, adaptation, classify, context_error,
                                   describe_change, diagnose, not_a_completion)
from activities.llm.probe import answers_seen, tools_seen
from activities.llm.replies import Reply, normalise


def _in_activity() -> bool:
    try:
        activity.info()
        return True
    except RuntimeError:
        return False


def _heartbeating(fn):
    """Run `fn` in a helper thread and heartbeat while it runs, so a long reply never looks like a
    dead worker (and a cancelled activity is noticed)."""
    if not _in_activity():
        return fn()
    ex = ThreadPoolExecutor(1, thread_name_prefix="llm-call")
    try:
        fut = ex.submit(fn)
        while True:
            try:
                return fut.result(timeout=1.0)
            except TimeoutError:
                activity.heartbeat()
    finally:
        ex.shutdown(wait=False)


def shape_roles(messages: list[dict], s: Profile) -> list[dict]:
    """The role rules of strict chat templates: no system message (its text leads the first user
    message), and consecutive messages of one role merged into one (tool answers stay apart)."""
    out = [dict(m) for m in messages]
    if not s.system_role:
        system = "\n\n".join(m["content"] for m in out if m["role"] == "system" and isinstance(m.get("content"), str))
        out = [m for m in out if m["role"] != "system"]
        if system:
            first = next((m for m in out if m["role"] == "user"), None)
            if first is None:
                out.insert(0, {"role": "user", "content": system})
            else:
                first["content"] = system + "\n\n" + (first.get("content") or "")
    if s.merge_roles:
        merged: list[dict] = []
        for m in out:
            prev = merged[-1] if merged else None
            if (prev is not None and prev["role"] == m["role"] and m["role"] in ("user", "system", "assistant")
                    and not prev.get("tool_calls") and not m.get("tool_calls")
                    and isinstance(prev.get("content"), str) and isinstance(m.get("content"), str)):
                prev["content"] = (prev["content"] + "\n\n" + m["content"]).strip("\n")
            else:
                merged.append(m)
        out = merged
    return out


def tool_choice(s: Profile, must_act: bool) -> str | None:
    """What the request's tool_choice says: some servers drop the tools without one (llama-cpp-python's),
    and a turn that must act (the caller says which) is told `required` where the profile allows."""
    if s.tool_choice == "auto" and must_act and s.required_turns:
        return "required"
    return s.tool_choice


def offered_tools(tools: list[dict] | None, s: Profile, only: str | None) -> list[dict] | None:
    """The tools a request offers: all of them, or where the turn must call `only`, that one alone unless
    the profile narrows by tool_choice (Profile.narrow_by_choice, native tools, a required call allowed)."""
    if not tools or only is None:
        return tools
    if s.narrow_by_choice and s.tool_mode != "text" and s.tool_choice == "auto" and s.required_turns:
        return tools
    return [t for t in tools if t["function"]["name"] == only]


def request_kwargs(ep: Endpoint, s: Profile, messages: list[dict], tools: list[dict] | None,
                   must_act: bool = False, only: str | None = None) -> dict:
    """`only`: the one tool this turn must call (must_act implied), offered as offered_tools says."""
    kwargs: dict = {"model": ep.model, "messages": shape_roles(messages, s)}
    tools = offered_tools(tools, s, only)
    if tools and s.tool_mode != "text":
        kwargs["tools"] = tools
        choice = tool_choice(s, must_act or only is not None)
        if choice == "required" and (only is not None or len(tools) == 1):  # the form more servers take
            choice = {"type": "function", "function": {"name": only or tools[0]["function"]["name"]}}
        if choice:
            kwargs["tool_choice"] = choice
    if s.reply_tokens:
        kwargs[s.token_param] = s.reply_tokens
    for name in ("temperature", "seed", "reasoning_effort"):
        if getattr(s, name) is not None:
            kwargs[name] = getattr(s, name)
    return kwargs


_NOTED: set[tuple] = set()  # adaptations already logged by this worker process: each is logged once


def _log_learned(ep: Endpoint, line: str) -> None:
    k = (ep.base_url, ep.model, line)
    if k in _NOTED:
        return
    _NOTED.add(k)
    if _in_activity():
        activity.logger.warning("model endpoint adapted: %s", line)


MAX_ADAPTATIONS = 4  # refusals answered by a change within one request; past that it is a config error
MAX_SHRINKS = 3


def chat(messages, ep: Endpoint, tools: list[dict] | None = None, adapted: dict | None = None,
         must_act: bool = False, only: str | None = None) -> Reply:
    """One Chat Completions exchange through the openai client. `messages` is a list, or a function
    (settings, shrink) -> messages that builds the prompt for the settings in force and a shrink level
    (0, 1, ...: smaller each time). A refusal that names a fix the profile allows (a parameter to drop
    or rename, no tool support, a tool_choice, strict roles, a context too small) is answered by that
    change and the request sent again; the change is returned in Reply.adapted for the run to keep. A
    native reply without a native tool call in the auto tool mode has the endpoint probed once for
    whether the schemas reach the model at all: where they do not, later turns use the text tool mode
    (this reply is kept and answered as it is). `must_act`: the turn must call a tool (tool_choice
    required where the profile allows); `only`: that tool (offered_tools). Raises ApplicationError
    (classified) for everything else."""
    build = messages if callable(messages) else (lambda s, shrink: messages)
    adapted = dict(adapted or {})
    learned: list[str] = []
    shrink = 0
    for _ in range(MAX_ADAPTATIONS + MAX_SHRINKS + 1):
        s = ep.settings(adapted)
        try:
            msgs = build(s, shrink)
        except ContextTooSmall as e:
            raise context_error(ep, s, adapted, e.needed) from None
        kwargs = request_kwargs(ep, s, msgs, tools, must_act, only)
        t0 = time.monotonic()
        try:
            raw = _heartbeating(lambda: client_for(ep).chat.completions.with_raw_response.create(**kwargs))
        except ApplicationError:
            raise
        except Exception as e:  # noqa: BLE001 - classified: every failure kind maps to a retry decision
            kind, info = diagnose(e)
            if kind == "other" and _refuses_required(e, kwargs):
                kind = "choice"
            if kind == "choice":  # a function named is "required" for one tool
                sent = kwargs.get("tool_choice")
                info = {**info, "sent": "required" if isinstance(sent, dict) else sent}
            change = adaptation(ep, s, kind, info, e)
            if change is None:
                raise classify(e, ep) from None
            if kind == "context":
                if not change or adapted.get("context_tokens") == change["context_tokens"]:
                    shrink += 1  # no new size named: smaller than last time
                if shrink > MAX_SHRINKS:
                    raise context_error(ep, s, {**adapted, **change}) from None
            elif len(learned) >= MAX_ADAPTATIONS or all(adapted.get(k) == v for k, v in change.items()):
                raise classify(e, ep) from None  # the change did not help: say what the endpoint said
            line = describe_change(kind, info, change, s)
            adapted.update(change)
            if line not in learned:
                learned.append(line)
                _log_learned(ep, line)
            continue
        reply = normalise(_raw_json(raw, ep), msgs, ep)
        reply.latency_s = time.monotonic() - t0
        reply.adapted, reply.learned, reply.mode = adapted, learned, ("native" if "tools" in kwargs else "text")
        if reply.mode == "native" and (not reply.tool_calls or reply.calls_from_text):
            _check_tools_seen(ep, s, kwargs["tools"], reply)
        if reply.mode == "native" and any(m.get("role") == "tool" for m in kwargs["messages"]):
            _check_answers_seen(ep, s, kwargs["tools"], reply)
        return reply
    raise config_error(f"{ep.where()}: refused every variant of the request; run `marathon llm-check`")


def _refuses_required(e: Exception, kwargs: dict) -> bool:
    """A request with tool_choice "required" (or a function named) answered 400, 422 or 500 without naming
    a cause: what llama-cpp-python's server does (its function-calling format takes only auto or a name;
    "required" is an empty 500)."""
    import openai

    choice = kwargs.get("tool_choice")
    return ((choice == "required" or isinstance(choice, dict)) and isinstance(e, openai.APIStatusError)
            and e.status_code in (400, 422, 500))


def post(ep: Endpoint, messages: list[dict], tools: list[dict] | None, s: Profile) -> dict:
    """One request as chat sends it, its reply's JSON; failures raised as the client raises them."""
    kwargs = request_kwargs(ep, s, messages, tools)
    return _raw_json(_heartbeating(lambda: client_for(ep).chat.completions.with_raw_response.create(**kwargs)), ep)


def _check_tools_seen(ep: Endpoint, s: Profile, tools: list[dict], reply: Reply) -> None:
    """In the auto tool mode, a reply that called no tool natively has the endpoint probed (once per
    worker) for whether the schemas reach the model; where they do not, the run adapts to text tools."""
    if s.tool_mode != "auto" or "tool_mode" in ep.explicit:
        return
    got, sent = tools_seen(ep, s, tools, lambda m, t, st: post(ep, m, t, st))
    if sent:  # paid tokens: counted with this turn
        reply.tokens_in += got.tokens_in
        reply.tokens_out += got.tokens_out
    reply.tools_seen = got
    if got.seen is False:
        _adapt(ep, s, reply, "dropped", got, {"tool_mode": "text"})


def _check_answers_seen(ep: Endpoint, s: Profile, tools: list[dict], reply: Reply) -> None:
    """A native request that carried tool answers has the endpoint probed (once per worker) for whether a
    tool message's content reaches the model; where it does not, later turns repeat the answers in a user
    message."""
    if s.tool_mode != "auto" or s.tool_answers != "tool" or "tool_answers" in ep.explicit:
        return  # a profile that names its tool mode (OpenAI's) is known to show tool answers
    got, sent = answers_seen(ep, s, tools, lambda m, t, st: post(ep, m, t, st))
    if sent:
        reply.tokens_in += got.tokens_in
        reply.tokens_out += got.tokens_out
    if got.seen is False:
        _adapt(ep, s, reply, "answers", got, {"tool_answers": "user"})


def _adapt(ep: Endpoint, s: Profile, reply: Reply, kind: str, got, change: dict) -> None:
    """A probe's finding as the reply's adaptation, said once."""
    line = describe_change(kind, {"probe": got.describe()}, change, s)
    reply.adapted = {**reply.adapted, **change}
    reply.learned = reply.learned + [line]
    _log_learned(ep, line)


def _raw_json(raw, ep: Endpoint) -> dict:
    try:
        data = json.loads(raw.text)
    except (ValueError, TypeError):
        raise _not_json(raw, ep) from None
    if not isinstance(data, dict):
        raise ApplicationError(f"{ep.where()}: the reply is not a JSON object", type="LLMServerError")
    if "choices" not in data or data.get("error"):  # another API's answer, or an error sent with a 200
        raise not_a_completion(data, ep)
    return data


def _not_json(raw, ep: Endpoint) -> ApplicationError:
    """A reply that is not JSON. A web page is what an OPENAI_BASE_URL naming a web server rather than its
    API gets (a UI or a proxy answers every path with a page), and waiting does not change it: the run
    pauses naming the setting. Anything else (a reply cut off on its way) may be transient: retried."""
    text = str(raw.text)
    page = "html" in str(raw.headers.get("content-type", "")).lower() or text.lstrip().startswith("<")
    if not page:
        return ApplicationError(f"{ep.where()}: the reply is not JSON: {redact(text[:200], ep)}",
                                type="LLMServerError")
    return ApplicationError(f"{ep.where()}: the reply is a web page, not a Chat Completions reply: "
                            f"{redact(text[:200], ep)}. OPENAI_BASE_URL names a web server, not its OpenAI-"
                            f"compatible API (that usually ends in /v1). {FIX_CONFIG}", type="LLMClientError",
                            non_retryable=True)
