"""The model endpoint: its kind (a Profile), the worker's configuration of it, and one openai client per
endpoint.

Configuration comes from the worker's environment (LlmSettings, parsed once when the worker is built),
never from workflow input: OPENAI_BASE_URL, OPENAI_API_KEY, MARATHON_MODEL (RunSpec.model overrides the
model name), MARATHON_LLM_TIMEOUT (seconds per request, default 300), MARATHON_LLM_PROFILE (the endpoint's
kind: PROFILES) and the MARATHON_LLM_* variables that override its settings (PROFILE_ENV),
MARATHON_PRICE_IN / MARATHON_PRICE_OUT (USD per million tokens, for the cost estimate). docs/llm.md has one
section per endpoint kind.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace

from temporalio.exceptions import ApplicationError


@dataclass(frozen=True)
class Profile:
    """How to talk to one kind of endpoint. Every field can be overridden from the worker's environment
    (PROFILE_ENV names the variable); a field left to the profile adapts when the endpoint refuses it."""

    name: str
    token_param: str = "max_tokens"  # or "max_completion_tokens" (OpenAI's reasoning models)
    reply_tokens: int | None = None  # cap on one reply; None: not sent (the server's default)
    temperature: float | None = None
    seed: int | None = None
    reasoning_effort: str | None = None  # low | medium | high, for reasoning models
    tool_mode: str = "auto"  # native | text | auto (native; text once the endpoint refuses or drops tools)
    tool_choice: str | None = "auto"  # auto | required | None (not sent), with native tools
    required_turns: bool = True  # a turn that must act is sent tool_choice "required" (where it is auto)
    merge_roles: bool = False  # one message per role in a row: strict chat templates (Gemma, Mistral)
    system_role: bool = True  # False: the system prompt goes at the top of the first user message
    context_tokens: int | None = None  # the endpoint's context window (prompt + reply); None: unknown
    # where tool answers reach the model: tool messages, or (user) also a user message, for servers whose
    # chat template drops a tool message's content (llama-cpp-python's chatml-function-calling)
    tool_answers: str = "tool"
    # a turn that must call one tool offers every tool and names that one in tool_choice, so the prompt's
    # tools stay as the turn before rendered them and a server's prompt cache covers it (llama-cpp-python's,
    # which renders the tools first and forces a named function by grammar); else that tool is offered alone
    narrow_by_choice: bool = False


PROFILES = {
    "auto": Profile("auto"),
    "openai-chat": Profile("openai-chat", reply_tokens=16384, tool_mode="native"),
    "openai-reasoning": Profile("openai-reasoning", token_param="max_completion_tokens", reply_tokens=32768,
                                reasoning_effort="medium", tool_mode="native"),
    "vllm": Profile("vllm", reply_tokens=8192, merge_roles=True),
    "sglang": Profile("sglang", reply_tokens=8192, merge_roles=True),
    "ollama": Profile("ollama", reply_tokens=4096, merge_roles=True, context_tokens=16384),
    "llamacpp": Profile("llamacpp", reply_tokens=4096, merge_roles=True, context_tokens=16384,
                        narrow_by_choice=True),
}

REPLY_SHARE = 4  # in a known context a reply may take a quarter of it; the prompt needs the rest


def fit_reply(s: Profile, fixed: bool) -> Profile:
    """The reply cap within a known context: at most a quarter of it, so that a prompt keeps room and a
    reply cut off at the cap still fits the next prompt. A cap MARATHON_LLM_MAX_TOKENS sets, or the
    endpoint refused, stays as it is."""
    if not s.context_tokens or fixed:
        return s
    cap = s.context_tokens // REPLY_SHARE
    return replace(s, reply_tokens=cap) if s.reply_tokens is None or s.reply_tokens > cap else s


PROFILE_ENV = {"token_param": "MARATHON_LLM_TOKEN_PARAM", "reply_tokens": "MARATHON_LLM_MAX_TOKENS",
               "temperature": "MARATHON_LLM_TEMPERATURE", "seed": "MARATHON_LLM_SEED",
               "reasoning_effort": "MARATHON_LLM_REASONING_EFFORT", "tool_mode": "MARATHON_LLM_TOOL_MODE",
               "tool_choice": "MARATHON_LLM_TOOL_CHOICE", "required_turns": "MARATHON_LLM_TOOL_REQUIRED",
               "merge_roles": "MARATHON_LLM_MERGE_ROLES", "system_role": "MARATHON_LLM_SYSTEM_ROLE",
               "context_tokens": "MARATHON_LLM_CONTEXT_TOKENS", "tool_answers": "MARATHON_LLM_TOOL_ANSWERS"}
_NONE = ("", "none", "off", "unset")


def worker_tag() -> str:
    """This process named as Temporal names a worker (pid@host), as config_error ends its message."""
    return f" [agent worker {os.getpid()}@{socket.gethostname()}]"


def config_error(text: str) -> ApplicationError:
    """A setting of this worker's that no retry mends. The worker is named as Temporal names it (pid@host):
    where several poll one task queue, the one that took the turn may not be the one set up for the run."""
    return ApplicationError(f"{text}{worker_tag()}", type="LLMConfigError", non_retryable=True)


def _env_value(field_name: str, raw: str):
    var = PROFILE_ENV[field_name]
    v = raw.strip().lower()
    try:
        if field_name == "token_param":
            if v not in ("max_tokens", "max_completion_tokens"):
                raise ValueError("max_tokens or max_completion_tokens")
            return v
        if field_name == "tool_mode":
            if v not in ("native", "text", "auto"):
                raise ValueError("native, text or auto")
            return v
        if field_name == "tool_answers":
            if v not in ("tool", "user"):
                raise ValueError("tool or user")
            return v
        if field_name == "tool_choice":
            if v not in ("auto", "required") + _NONE:
                raise ValueError("auto, required or none")
            return None if v in _NONE else v
        if field_name in ("merge_roles", "system_role", "required_turns"):
            if v not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError("1 or 0")
            return v in ("1", "true", "yes")
        if v in _NONE:
            return None
        if field_name == "temperature":
            return float(v)
        if field_name == "reasoning_effort":
            if v not in ("minimal", "low", "medium", "high"):
                raise ValueError("minimal, low, medium, high or none")
            return v
        n = int(v)
        if n < 1 and field_name != "seed":
            raise ValueError("a positive number or none")
        return n
    except ValueError as e:
        hint = str(e) if not str(e).startswith(("invalid literal", "could not convert")) else \
            "a number or none"
        raise config_error(f"{var}={raw!r} on the agent worker is not valid: expected {hint}") from None


@dataclass
class Endpoint:
    base_url: str | None
    api_key: str
    model: str
    timeout: float
    profile: Profile
    explicit: frozenset = frozenset()  # profile fields set by the worker's environment: never adapted
    price_in: float = 0.0
    price_out: float = 0.0

    def settings(self, adapted: dict | None) -> Profile:
        """The profile with what this run has learned from the endpoint applied, its reply cap within
        a known context (fit_reply)."""
        known = {k: v for k, v in (adapted or {}).items() if k in Profile.__dataclass_fields__ and k != "name"}
        s = replace(self.profile, **known) if known else self.profile
        return fit_reply(s, "reply_tokens" in self.explicit or "reply_tokens" in known)

    def where(self) -> str:
        return f"model endpoint {self.base_url or 'api.openai.com'} (model {self.model})"


@dataclass(frozen=True)
class LlmSettings:
    """The worker's endpoint configuration, parsed from its environment once, when the worker is built. An
    invalid variable is kept as `error` and raised by every llm activity: a worker that only runs the search
    policy starts without one."""

    base_url: str | None = None
    api_key: str = ""
    model: str = ""
    profile: str = "auto"
    overrides: tuple[tuple[str, object], ...] = ()  # (Profile field, value) set by MARATHON_LLM_* variables
    timeout: float = 300.0
    price_in: float = 0.0
    price_out: float = 0.0
    error: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LlmSettings:
        base = cls(base_url=env.get("OPENAI_BASE_URL") or None, api_key=env.get("OPENAI_API_KEY", ""),
                   model=env.get("MARATHON_MODEL", ""))
        pname = env.get("MARATHON_LLM_PROFILE", "").strip() or "auto"
        try:
            if pname not in PROFILES:
                raise config_error(f"MARATHON_LLM_PROFILE={pname!r} on the agent worker is not a profile; "
                                   f"profiles: {', '.join(PROFILES)}")
            overrides = tuple((f, _env_value(f, env[var])) for f, var in PROFILE_ENV.items() if var in env)
            try:
                timeout = float(env.get("MARATHON_LLM_TIMEOUT", "300"))
                prices = (float(env.get("MARATHON_PRICE_IN", "0")), float(env.get("MARATHON_PRICE_OUT", "0")))
            except ValueError:
                raise config_error("MARATHON_LLM_TIMEOUT, MARATHON_PRICE_IN and MARATHON_PRICE_OUT must be "
                                   "numbers") from None
        except ApplicationError as e:
            return replace(base, error=e.message)
        return replace(base, profile=pname, overrides=overrides, timeout=timeout, price_in=prices[0],
                       price_out=prices[1])

    def endpoint(self, model: str | None = None, profile: str | None = None) -> Endpoint:
        """The endpoint a run talks to: RunSpec.model and a profile named by the caller override the
        worker's."""
        name = model or self.model
        if not self.api_key:
            raise config_error("OPENAI_API_KEY is not set on the agent worker; set it, restart the worker, then "
                               "`marathon resume`")
        if not name:
            raise config_error("no model: set MARATHON_MODEL on the agent worker or RunSpec.model")
        if self.error:
            raise config_error(self.error)
        pname = (profile or "").strip() or self.profile
        if pname not in PROFILES:
            raise config_error(f"profile {pname!r} is not a profile; profiles: {', '.join(PROFILES)}")
        overrides = dict(self.overrides)
        return Endpoint(base_url=self.base_url, api_key=self.api_key, model=name, timeout=self.timeout,
                        profile=replace(PROFILES[pname], **overrides), explicit=frozenset(overrides),
                        price_in=self.price_in, price_out=self.price_out)


_CLIENTS: dict[tuple, object] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(ep: Endpoint):
    from openai import OpenAI

    k = (ep.base_url, ep.api_key, ep.timeout)
    with _CLIENTS_LOCK:
        if k not in _CLIENTS:
            _CLIENTS[k] = OpenAI(base_url=ep.base_url, api_key=ep.api_key, timeout=ep.timeout, max_retries=0)
        return _CLIENTS[k]


def redact(text: str, ep: Endpoint | None) -> str:
    if ep and ep.api_key:
        text = text.replace(ep.api_key, "[redacted]")
    return re.sub(r"\b(sk-[A-Za-z0-9_\-]{4})[A-Za-z0-9_\-*]+", r"\1...[redacted]", text)


def cost(ep: Endpoint, tin: int, tout: int) -> float:
    return (tin * ep.price_in + tout * ep.price_out) / 1e6


def env_text(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return "none" if v is None else str(v)
