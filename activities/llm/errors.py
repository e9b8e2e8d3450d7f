"""Endpoint failures: what kind each is, so that Temporal retries what waiting fixes and pauses the run
on what only the operator can fix, and which refusals name a change the request can make by itself.

The client never retries (max_retries=0): Temporal does, by the error's kind. 429: retryable with the
server's Retry-After as the next delay. 5xx, 408, timeouts, connection errors: retryable with backoff.
A refusal that names its fix (a parameter, no tool support, strict roles, a context too small) is
answered by the change the profile allows and sent again at once (chat.chat). Authentication, quota,
permission, unknown model and other 4xx: non-retryable, so the run pauses with a message naming the
remedy until an operator fixes the configuration and resumes.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from dataclasses import replace
from datetime import timedelta

from temporalio.exceptions import ApplicationError

from activities.llm.endpoint import PROFILE_ENV, Endpoint, Profile, config_error, redact


def _retry_after(response) -> float | None:
    if response is None:
        return None
    h = response.headers
    try:
        if h.get("retry-after-ms"):
            return float(h["retry-after-ms"]) / 1000
        ra = h.get("retry-after")
        if ra is None:
            return None
        try:
            return float(ra)
        except ValueError:
            when = email.utils.parsedate_to_datetime(ra)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


FIX_CONFIG = "Fix the agent worker's configuration (OPENAI_API_KEY, OPENAI_BASE_URL, MARATHON_MODEL), restart " \
              "it, then `marathon resume`."


def classify(e: Exception, ep: Endpoint | None) -> ApplicationError:
    """An endpoint failure as the ApplicationError whose retryability Temporal acts on, its message
    naming what fixes it."""
    import openai

    msg = redact(str(e), ep)[:600]
    where = ep.where() if ep else "model endpoint"
    if isinstance(e, openai.APITimeoutError):
        return ApplicationError(f"{where}: request timed out after {ep.timeout if ep else '?'} s",
                                type="LLMTimeout")
    if isinstance(e, openai.APIConnectionError):
        return ApplicationError(f"{where}: connection failed: {msg}", type="LLMConnectionError")
    if isinstance(e, openai.APIStatusError):
        code = e.status_code
        body = getattr(e, "body", None)
        err_code = body.get("code") if isinstance(body, dict) else None
        if code == 429:
            if err_code == "insufficient_quota":  # not transient: waiting does not refill a quota
                return ApplicationError(f"{where}: 429 quota exhausted: {msg}. Add credit or use another "
                                        f"OPENAI_API_KEY on the agent worker, restart it, then `marathon resume`.",
                                        type="LLMQuotaError", non_retryable=True)
            delay = _retry_after(e.response)
            return ApplicationError(f"{where}: 429 rate limited (retry after {delay if delay is not None else '?'} s)",
                                    type="RateLimited",
                                    next_retry_delay=timedelta(seconds=delay) if delay is not None else None)
        if code >= 500 or code in (408, 409):
            return ApplicationError(f"{where}: {code} server error: {msg}", type="LLMServerError")
        if code in (401, 403):
            kind = "authentication failed" if code == 401 else "permission denied"
            return ApplicationError(f"{where}: {code} {kind}: {msg}. Set a valid OPENAI_API_KEY for "
                                    f"{ep.base_url if ep and ep.base_url else 'api.openai.com'} on the agent "
                                    f"worker (and check OPENAI_BASE_URL), restart it, then `marathon resume`.",
                                    type="LLMAuthError", non_retryable=True)
        kind = {400: "bad request", 404: "not found (unknown model or wrong OPENAI_BASE_URL?)",
                413: "request too large", 422: "unprocessable request"}.get(code, "client error")
        return ApplicationError(f"{where}: {code} {kind}: {msg}. {FIX_CONFIG}", type="LLMClientError",
                                non_retryable=True)
    if isinstance(e, ApplicationError):
        return e
    return ApplicationError(f"{where}: {type(e).__name__}: {msg}", type="LLMError")


_TRANSIENT = (408, 409, 429)  # and every 5xx: statuses that waiting may mend


def not_a_completion(data: dict, ep: Endpoint) -> ApplicationError:
    """A 200 reply whose JSON is no Chat Completions reply at all. An error object: a proxy (OpenRouter)
    answers 200 before its upstream does, so the upstream's failure rides the body with its status as
    `code`; a transient status is retried as that status would be, any other error pauses the run naming
    it. JSON without `choices` is some other API's answer (OPENAI_BASE_URL naming another JSON service, or
    a path of it), which waiting does not change: it pauses naming the setting."""
    err = data.get("error")
    if err:
        text = _body_text(data)[0]
        code = err.get("code") if isinstance(err, dict) else None
        status = code if isinstance(code, int) and not isinstance(code, bool) else None
        if status is not None and (status >= 500 or status in _TRANSIENT):
            return ApplicationError(f"{ep.where()}: {status} error in a 200 reply: {redact(text, ep)[:600]}",
                                    type="RateLimited" if status == 429 else "LLMServerError")
        return ApplicationError(f"{ep.where()}: the endpoint answered 200 with an error instead of a reply: "
                                f"{redact(text, ep)[:600]}. {FIX_CONFIG}", type="LLMClientError",
                                non_retryable=True)
    return ApplicationError(f"{ep.where()}: the reply is JSON but not a Chat Completions reply (it has no "
                            f"`choices`): {redact(json.dumps(data)[:200], ep)}. OPENAI_BASE_URL names a server that "
                            f"is not an OpenAI-compatible API, or not its API's root (that usually ends in /v1). "
                            f"{FIX_CONFIG}", type="LLMClientError", non_retryable=True)


# What a refusal says, and what fixes it. Matched on the error's text (and `param` where the server
# names one): servers word these differently, and some send them as 500s.
_PARAM_NAMES = ("max_completion_tokens", "max_tokens", "temperature", "seed", "reasoning_effort")
_NO_TOOLS = re.compile(r"does not support tools|tool choice requires|enable-auto-tool-choice|tools? (param|"
                       r"parameter)s? (requires|is not supported)|--jinja|tools are not supported|"
                       r"unsupported parameter:? '?tools|tool(s| calling| use)? (is |are )?not (supported|enabled)",
                       re.I)
_CHOICE = re.compile(r"tool_choice|tool choice", re.I)  # after _NO_TOOLS: vLLM's "auto" tool choice is no tools
_ROLES = re.compile(r"roles must alternate|must alternate (between )?user|conversation roles|"
                    r"after the optional system message", re.I)
_NO_SYSTEM = re.compile(r"system role (is )?not supported|system messages? (is |are )?not supported", re.I)
_CONTEXT = re.compile(r"context[_ ]length[_ ]exceeded|maximum context length|exceeds? the (available )?context|"
                      r"context (window|size|length) (of \d+ tokens )?(is )?exceeded|too many tokens|"
                      r"prompt is too long|input (is )?too long|longer than the model'?s? context", re.I)


def _error_text(e) -> tuple[str, str | None, str | None]:
    """(message, param, code) of an endpoint's error body, whatever its shape."""
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        return _body_text(body)
    return str(body if body is not None else getattr(e, "message", e)), None, None


def _body_text(body: dict) -> tuple[str, str | None, str | None]:
    """(message, param, code) of an error body: the object itself or under `error`."""
    if isinstance(body.get("error"), dict):
        body = body["error"]
    m = body.get("message") or body.get("detail") or body.get("error") or json.dumps(body)
    return str(m), (body.get("param") if isinstance(body.get("param"), str) else None), \
        (body.get("code") if isinstance(body.get("code"), str) else None)


def diagnose(e: Exception) -> tuple[str, dict]:
    """What an endpoint's refusal asks for: ("param", {name, replacement}), ("tools", {}), ("choice", {})
    (the tool_choice sent), ("roles", {}), ("system", {}), ("context", {limit}) or ("other", {})."""
    import openai

    if not isinstance(e, openai.APIStatusError) or e.status_code in (401, 403, 404, 408, 409, 429):
        return "other", {}
    text, param, code = _error_text(e)
    low = text.lower()
    if _CONTEXT.search(text) or code == "context_length_exceeded":
        m = re.search(r"(?:maximum context length|context (?:window|size|length))(?: of| is)?\s*(\d{3,})", text, re.I)
        body = getattr(e, "body", None)
        body = body.get("error", body) if isinstance(body, dict) else {}
        n_ctx = body.get("n_ctx") if isinstance(body, dict) else None  # llama.cpp says it apart from the text
        limit = int(m.group(1)) if m else (int(n_ctx) if isinstance(n_ctx, int) and n_ctx > 0 else None)
        return "context", {"limit": limit}
    if _NO_TOOLS.search(text) or param == "tools":
        return "tools", {}
    if param == "tool_choice" or _CHOICE.search(text):
        return "choice", {}
    if _NO_SYSTEM.search(text):
        return "system", {}
    if _ROLES.search(text):
        return "roles", {}
    if code in ("unsupported_parameter", "unsupported_value") or "unsupported" in low or "not supported" in low \
            or "unrecognized" in low or "unknown parameter" in low or "extra inputs" in low:
        name = param if param in _PARAM_NAMES else next((p for p in _PARAM_NAMES if re.search(
            rf"['\"`]?\b{p}\b['\"`]?", text)), None)
        if name:
            repl = next((p for p in _PARAM_NAMES if p != name and re.search(
                rf"(use|instead|replacement|try)\W+(\w+\W+){{0,3}}['\"`]?{p}\b", text, re.I)), None)
            return "param", {"name": name, "replacement": repl}
    return "other", {}


class ContextTooSmall(Exception):
    """The prompt cannot fit the endpoint's context even at its smallest; `needed`: the tokens it takes."""

    def __init__(self, needed: int | None = None) -> None:
        super().__init__(needed)
        self.needed = needed


def adaptation(ep: Endpoint, s: Profile, kind: str, info: dict, e: Exception) -> dict | None:
    """The settings change that answers a refusal, or None (classified as it is). A setting the worker's
    environment fixed is never changed: the refusal pauses the run naming that variable."""
    def fixed(field_name: str) -> bool:
        if field_name in ep.explicit:
            raise config_error(f"{ep.where()} refused the request: {redact(_error_text(e)[0], ep)[:300].rstrip('.')}. "
                                f"Change {PROFILE_ENV[field_name]} on the agent worker (it is set to "
                                f"{getattr(s, field_name)!r}), restart it, then `marathon resume`.") from None
        return False

    if kind == "param":
        name, repl = info["name"], info["replacement"]
        if name in ("max_tokens", "max_completion_tokens"):
            if name != s.token_param:
                return None
            fixed("token_param")
            if repl in ("max_tokens", "max_completion_tokens"):
                return {"token_param": repl}
            fixed("reply_tokens")
            return {"reply_tokens": None}
        if name in ("temperature", "seed", "reasoning_effort") and getattr(s, name) is not None:
            fixed(name)
            return {name: None}
        return None
    if kind == "tools":
        if s.tool_mode == "text":
            return None
        if s.tool_mode == "native":
            raise config_error(f"{ep.where()} does not take tools: {redact(_error_text(e)[0], ep)[:300].rstrip('.')}. "
                                f"Set MARATHON_LLM_TOOL_MODE=text (or auto) on the agent worker, or start the "
                                f"server with tool calling on (vLLM: --enable-auto-tool-choice "
                                f"--tool-call-parser NAME; SGLang: --tool-call-parser NAME; llama.cpp: --jinja), "
                                f"then restart the agent worker and `marathon resume`.")
        return {"tool_mode": "text"}
    if kind == "choice":  # what was sent is refused: required becomes auto, auto becomes none sent
        if info.get("sent") == "required":
            fixed("tool_choice" if s.tool_choice == "required" else "required_turns")
            return {"tool_choice": "auto", "required_turns": False}
        if info.get("sent"):
            fixed("tool_choice")
            return {"tool_choice": None, "required_turns": False}
        return None
    if kind == "system":
        if not s.system_role:
            return None
        fixed("system_role")
        return {"system_role": False}
    if kind == "roles":
        if not s.merge_roles:
            fixed("merge_roles")
            return {"merge_roles": True}
        if s.system_role:
            fixed("system_role")
            return {"system_role": False}
        return None
    if kind == "context":
        limit = info.get("limit")
        return {"context_tokens": limit} if limit else {}
    return None


def describe_change(kind: str, info: dict, change: dict, s: Profile) -> str:
    if kind == "param":
        if "token_param" in change:
            return f"the endpoint refuses {info['name']}: sending {change['token_param']} instead"
        return f"the endpoint refuses {info['name']}: not sent"
    if kind == "tools":
        return "the endpoint does not take tools: text tool mode (fenced code and TOOL: lines)"
    if kind == "dropped":
        return (f"the endpoint drops the tool schemas from the prompt without a word ({info['probe']}): "
                f"text tool mode (fenced code and TOOL: lines)")
    if kind == "answers":
        return (f"the endpoint drops the tools' answers from the prompt without a word ({info['probe']}): "
                f"each answer repeated in a user message")
    if kind == "choice":
        return (f"the endpoint refuses tool_choice {info.get('sent')!r}: "
                + ("sending auto" if change.get("tool_choice") == "auto" else "not sent"))
    if kind == "system":
        return "the endpoint refuses a system message: the system prompt leads the first user message"
    if kind == "roles":
        return ("the endpoint's chat template needs alternating roles: consecutive messages merged"
                if "merge_roles" in change else "the endpoint's chat template needs alternating roles: "
                "no system message either")
    limit = change.get("context_tokens")
    return (f"the prompt exceeded the endpoint's context ({limit} tokens): shrinking it" if limit
            else "the prompt exceeded the endpoint's context: shrinking it")


def context_error(ep: Endpoint, s: Profile, adapted: dict, needed: int | None = None) -> ApplicationError:
    """The prompt does not fit: what would help (context.too_small), pausing the run."""
    from activities.llm.context import too_small

    known = s.context_tokens if not adapted.get("context_tokens") else adapted["context_tokens"]
    return ApplicationError(too_small(ep, replace(s, context_tokens=known), needed), type="LLMContextError",
                            non_retryable=True)
