"""`marathon llm-check`: one tiny request to the configured endpoint, and what a run would make of it."""

from __future__ import annotations

import os
import re

from temporalio.exceptions import ApplicationError

from activities.llm.chat import chat, post
from activities.llm.context import get_json, listed_models, with_server_context
from activities.llm.prompt import context_fit
from activities.llm.endpoint import PROFILE_ENV, LlmSettings, env_text, worker_tag
from activities.llm.errors import describe_change
from activities.llm.probe import ToolsSeen, answers_seen, tools_seen
from activities.llm.sources import extract_code
from activities.llm.tools import TEXT_PROTOCOL, tool_schema

_CHECK_TOOL = tool_schema("read_notebook", "Read the run's notebook.")


def llm_check(model: str | None = None, profile: str | None = None) -> tuple[bool, list[str]]:
    """One tiny request with the worker's configured endpoint and profile: what works, what was adapted
    (and the setting that makes it so from the start), what to change. (usable, report lines)."""
    try:
        ep = with_server_context(LlmSettings.from_env(os.environ).endpoint(model, profile))
    except ApplicationError as e:
        return False, [f"configuration: {for_check(e.message)}"]
    p = ep.settings(None)  # the reply cap within a known context
    lines = [f"endpoint: {ep.base_url or 'https://api.openai.com/v1'}, model {ep.model}, profile {p.name}",
             f"settings: {p.token_param}={p.reply_tokens or '(not sent)'}, tool mode {p.tool_mode}, "
             f"merge roles {'on' if p.merge_roles else 'off'}, system role {'on' if p.system_role else 'off'}, "
             f"temperature {p.temperature if p.temperature is not None else '(server default)'}, seed "
             f"{p.seed if p.seed is not None else '-'}, reasoning effort {p.reasoning_effort or '-'}, context "
             f"{p.context_tokens or 'unknown'}"]
    unlisted = _unlisted_model(ep)
    if unlisted:
        return False, lines + [unlisted]
    def msgs(s, shrink):  # in text mode the system prompt describes the protocol, as a run's does
        system = "You are checking a connection. Do exactly what the user asks."
        if s.tool_mode == "text":
            system += "\n\n" + TEXT_PROTOCOL + "read_notebook (Read the run's notebook.)."
        return [{"role": "system", "content": system},
                {"role": "user", "content": "Call the tool read_notebook with no arguments. If you cannot call "
                                            "tools, reply with exactly this line:\nTOOL: read_notebook"}]
    try:
        reply = chat(msgs, ep, [_CHECK_TOOL], must_act=True)
    except ApplicationError as e:
        return False, lines + [f"FAILED: {for_check(e.message)}"]
    first = reply
    seen = _tools_seen(ep, reply)
    if seen is not None and seen.seen is False and "tool_mode" not in reply.adapted and \
            ep.settings(reply.adapted).tool_mode == "auto" and "tool_mode" not in ep.explicit:
        # a call forced by name comes back without the schemas in the prompt; a run's auto turns would not
        line = describe_change("dropped", {"probe": seen.describe()}, {"tool_mode": "text"}, p)
        reply.adapted, reply.learned = {**reply.adapted, "tool_mode": "text"}, reply.learned + [line]
    if seen is not None and seen.seen is False and reply.adapted.get("tool_mode") == "text":
        try:  # what the run's next turns do: the same request in text mode
            reply = chat(msgs, ep, [_CHECK_TOOL], adapted=reply.adapted, must_act=True)
        except ApplicationError as e:
            return False, lines + [f"FAILED in text tool mode: {for_check(e.message)}"]
    answers = _answers_seen(ep, reply)
    if answers is not None and answers.seen is False and "tool_answers" not in reply.adapted:
        line = describe_change("answers", {"probe": answers.describe()}, {"tool_answers": "user"}, p)
        reply.adapted, reply.learned = {**reply.adapted, "tool_answers": "user"}, reply.learned + [line]
    lines.append(f"reply: {first.latency_s:.2f} s, {first.tokens_in} tokens in / {first.tokens_out} out, model "
                 f"{first.model}, finish_reason {first.finish_reason or '-'}")
    learned = first.learned + [x for x in reply.learned if x not in first.learned]
    for line in learned:
        lines.append(f"adapted: {line}")
    a = reply.adapted
    if seen is not None and seen.seen is False:
        lines.append(_DROPPED_CAUSE if a.get("tool_mode") == "text" else _DROPPED_CAUSE + _DROPPED_NATIVE)
    elif seen is not None and seen.seen:
        lines.append(f"tool schemas: they reach the model ({seen.describe()})")
    if answers is not None and answers.seen:
        lines.append(f"tool answers: they reach the model ({answers.describe()})")
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
    blind = seen is not None and seen.seen is False and reply.mode == "native"  # a run's turns see no tool
    # in text mode a reply with a fenced module and no TOOL: line is a run's submission: usable, weakly
    module = reply.mode == "text" and not reply.tool_calls and bool(extract_code(reply.content))
    ok = (bool(reply.tool_calls) or module) and reply.finish_reason != "length" and not blind
    if ok and small:
        ok = False
        lines.append("NOT OK: a run's prompt does not fit the endpoint's context (above)")
    elif ok and module:
        lines.append("OK, weakly: in text tool mode the model wrote code without a TOOL: line, which a run takes "
                     "as a submission; a larger model follows the protocol")
    elif ok:
        lines.append("OK: a run can use this endpoint")
    elif blind:
        lines.append("NOT OK: the tools never reach the model; see the cause and the fix above")
    elif seen is not None and seen.seen is False:
        lines.append("NOT OK: in text tool mode the model called no tool either; try a larger model")
    elif seen is not None and seen.seen:
        lines.append("NOT OK: the tool schemas reach the model (" + seen.describe() + "), but it called no tool: "
                     "a model this weak may not; try a larger model, or MARATHON_LLM_TOOL_MODE=text")
    else:
        lines.append("NOT OK: the model did not call the tool; try another profile or model")
    return ok, lines


_DROPPED_CAUSE = ("cause: the server takes the `tools` of a request and leaves them out of the prompt, without an "
                  "error: the model never sees them. llama-cpp-python's server keeps them only with --chat_format "
                  "chatml-function-calling (or functionary) and a tool_choice, which the run sends; llama.cpp's "
                  "llama-server needs --jinja. Fix: start the server so, or set MARATHON_LLM_TOOL_MODE=text "
                  "(the auto tool mode falls back to text by itself)")
_DROPPED_NATIVE = "; MARATHON_LLM_TOOL_MODE=native keeps the run from falling back"


# How a run's remedy ends: its worker reads the environment once, when it starts, and a paused run goes
# on at `marathon resume`. llm-check reads this environment each time it runs and resumes nothing.
_RUN_REMEDY_END = re.compile(r",? (then )?(restart (it|the (agent )?worker),? (then|and) )?`marathon resume( ID)?`")


def for_check(message: str) -> str:
    """A failure's message, worded for a run and its worker, as llm-check says it: no worker named, the
    model given by --model, the remedy ending in running llm-check again."""
    message = message.replace(worker_tag(), "").replace("RunSpec.model", "pass --model")
    return _RUN_REMEDY_END.sub(", then run `marathon llm-check` again", message)


SHOWN_MODELS = 8  # of the models an endpoint lists, named in the line that says the model is not one


def _unlisted_model(ep) -> str | None:
    """The line saying the model named is not among those the endpoint lists at /v1/models, or None (it is,
    or the endpoint lists none). Some servers answer a request for any model name with the one model they
    serve (llama-cpp-python's), so a reply alone does not tell. Ollama takes a name without its `:latest`."""
    ids = listed_models(get_json((ep.base_url or "https://api.openai.com/v1").rstrip("/") + "/models", ep.api_key))
    if not ids or ep.model in ids or f"{ep.model}:latest" in ids:
        return None
    more = f" and {len(ids) - SHOWN_MODELS} more" if len(ids) > SHOWN_MODELS else ""
    return (f"NOT OK: the endpoint does not list the model {ep.model} at /v1/models; it lists "
            f"{', '.join(ids[:SHOWN_MODELS])}{more}: set MARATHON_MODEL (or --model) to one of them")


def _tools_seen(ep, reply) -> ToolsSeen | None:
    """Whether the schemas reach the model, told by the probe (the one chat ran, else one sent here):
    a native call is no proof, as a server may force a call by name with the schema left out of the
    prompt (llama-cpp-python with the model's own chat template does)."""
    if reply.mode != "native":
        return None
    if reply.tools_seen is not None:
        return reply.tools_seen
    return tools_seen(ep, ep.settings(reply.adapted), [_CHECK_TOOL], lambda m, t, st: post(ep, m, t, st))[0]


def _answers_seen(ep, reply) -> ToolsSeen | None:
    """Whether a tool message's content reaches the model (the probe a run's first answered turn sends),
    where a run would ask: native tools in the auto tool mode, the answers' place not set by a variable."""
    s = ep.settings(reply.adapted)
    if reply.mode != "native" or s.tool_mode != "auto" or s.tool_answers != "tool" or "tool_answers" in ep.explicit:
        return None
    return answers_seen(ep, s, [_CHECK_TOOL], lambda m, t, st: post(ep, m, t, st))[0]
