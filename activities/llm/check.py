"""`marathon llm-check`: one tiny request to the configured endpoint, and what a run would make of it."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from activities.llm.chat import chat
from activities.llm.context import context_fit, with_server_context
from activities.llm.endpoint import PROFILE_ENV, endpoint, env_text
from activities.llm.tools import tool_schema

_CHECK_TOOL = tool_schema("read_notebook", "Read the run's notebook.")


def llm_check(model: str | None = None, profile: str | None = None) -> tuple[bool, list[str]]:
    """One tiny request with the worker's configured endpoint and profile: what works, what was adapted
    (and the setting that makes it so from the start), what to change. (usable, report lines)."""
    try:
        ep = with_server_context(endpoint(model, profile))
    except ApplicationError as e:
        return False, [f"configuration: {e.message}"]
    p = ep.settings(None)  # the reply cap within a known context
    lines = [f"endpoint: {ep.base_url or 'https://api.openai.com/v1'}, model {ep.model}, profile {p.name}",
             f"settings: {p.token_param}={p.reply_tokens or '(not sent)'}, tool mode {p.tool_mode}, "
             f"merge roles {'on' if p.merge_roles else 'off'}, system role {'on' if p.system_role else 'off'}, "
             f"temperature {p.temperature if p.temperature is not None else '(server default)'}, seed "
             f"{p.seed if p.seed is not None else '-'}, reasoning effort {p.reasoning_effort or '-'}, context "
             f"{p.context_tokens or 'unknown'}"]
    msgs = [{"role": "system", "content": "You are checking a connection. Do exactly what the user asks."},
            {"role": "user", "content": "Call the tool read_notebook with no arguments. If you cannot call "
                                        "tools, reply with exactly this line:\nTOOL: read_notebook"}]
    try:
        reply = chat(msgs, ep, [_CHECK_TOOL])
    except ApplicationError as e:
        return False, lines + [f"FAILED: {e.message}"]
    lines.append(f"reply: {reply.latency_s:.2f} s, {reply.tokens_in} tokens in / {reply.tokens_out} out, model "
                 f"{reply.model}, finish_reason {reply.finish_reason or '-'}")
    for line in reply.learned:
        lines.append(f"adapted: {line}")
    a = reply.adapted
    env = {k: v for k, v in a.items() if k in PROFILE_ENV and k != "context_tokens"}
    if env:
        sets = " ".join(f"{PROFILE_ENV[k]}={env_text(v)}" for k, v in env.items())
        lines.append(f"a run adapts the same way by itself; to start that way set: {sets}")
    if a.get("context_tokens"):
        lines.append(f"the endpoint's context is {a['context_tokens']} tokens: set MARATHON_LLM_CONTEXT_TOKENS="
                     f"{a['context_tokens']}")
    names = [c["name"] for c in reply.tool_calls]
    if reply.tool_calls and not reply.calls_from_text and reply.mode == "native":
        lines.append(f"tool calls: native ({', '.join(names)})")
    elif reply.tool_calls:
        how = "text mode" if reply.mode == "text" else "written as text in the reply (parsed)"
        lines.append(f"tool calls: {how} ({', '.join(names)})")
    else:
        lines.append("tool calls: none came back; the model answered: " + (reply.content[:200] or "(nothing)"))
    if reply.finish_reason == "length":
        lines.append(f"the reply was cut off at the reply cap: raise MARATHON_LLM_MAX_TOKENS (now "
                     f"{ep.settings(a).reply_tokens})")
    if not reply.reasoning and not reply.content and not reply.tool_calls:
        lines.append("the reply was empty")
    small = context_fit(ep, ep.settings(a), reply.mode)  # a run's prompt and reply within a known context
    if small:
        lines.append(f"context: {small}")
    ok = bool(reply.tool_calls) and reply.finish_reason != "length" and not small
    lines.append("OK: a run can use this endpoint" if ok else
                 "NOT OK: a run's prompt does not fit the endpoint's context (above)" if small else
                 "NOT OK: the model did not call the tool; try another profile or model")
    return ok, lines
