"""One Chat Completions exchange: the request shaped for the endpoint's settings, sent with heartbeats,
refusals that name their fix answered by that change, the reply normalised."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.llm.endpoint import Endpoint, Profile, client_for, config_error, redact
from activities.llm.errors import (ContextTooSmall, adaptation, classify, context_error, describe_change,
                                   diagnose)
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


def request_kwargs(ep: Endpoint, s: Profile, messages: list[dict], tools: list[dict] | None) -> dict:
    kwargs: dict = {"model": ep.model, "messages": shape_roles(messages, s)}
    if tools and s.tool_mode != "text":
        kwargs["tools"] = tools
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


def chat(messages, ep: Endpoint, tools: list[dict] | None = None, adapted: dict | None = None) -> Reply:
    """One Chat Completions exchange through the openai client. `messages` is a list, or a function
    (settings, shrink) -> messages that builds the prompt for the settings in force and a shrink level
    (0, 1, ...: smaller each time). A refusal that names a fix the profile allows (a parameter to drop
    or rename, no tool support, strict roles, a context too small) is answered by that change and the
    request sent again; the change is returned in Reply.adapted for the run to keep. Raises
    ApplicationError (classified) for everything else."""
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
        kwargs = request_kwargs(ep, s, msgs, tools)
        t0 = time.monotonic()
        try:
            raw = _heartbeating(lambda: client_for(ep).chat.completions.with_raw_response.create(**kwargs))
        except ApplicationError:
            raise
        except Exception as e:  # noqa: BLE001 - classified: every failure kind maps to a retry decision
            kind, info = diagnose(e)
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
        return reply
    raise config_error(f"{ep.where()}: refused every variant of the request; run `marathon llm-check`")


def _raw_json(raw, ep: Endpoint) -> dict:
    try:
        data = json.loads(raw.text)
    except (ValueError, TypeError):
        raise ApplicationError(f"{ep.where()}: the reply is not JSON: {redact(str(raw.text)[:200], ep)}",
                               type="LLMServerError") from None
    if not isinstance(data, dict):
        raise ApplicationError(f"{ep.where()}: the reply is not a JSON object", type="LLMServerError")
    return data
