"""Policy `llm`: the model turn and the read-only tools, as activities of the agent worker.

`llm_turn` builds the turn's prompt (the objective restated, the starting kernel, the notebook, the
last few turns, then the run's state, top-k kernels and the operator's hints) within a token budget,
asks any OpenAI-compatible Chat Completions endpoint for the next step, stores prompt and reply in the
artifact store and returns the tool calls with kernel sources replaced by artifact keys. The workflow
executes every call (each one activity) and hands the answers to the next turn. `llm_tool` answers the
tools that only read.

Configuration comes from the worker's environment, never from workflow input: OPENAI_BASE_URL,
OPENAI_API_KEY, MARATHON_MODEL (RunSpec.model overrides the model name), MARATHON_LLM_TIMEOUT (seconds
per request, default 300), MARATHON_LLM_PROFILE (the endpoint's kind: PROFILES) and the MARATHON_LLM_*
variables that override its settings (PROFILE_ENV), MARATHON_PRICE_IN / MARATHON_PRICE_OUT (USD per
million tokens, for the cost estimate). docs/llm.md has one section per endpoint kind.

The client never retries (max_retries=0): Temporal does, by the error's kind. 429: retryable with the
server's Retry-After as the next delay. 5xx, 408, timeouts, connection errors: retryable with backoff.
A refusal that names its fix (a parameter, no tool support, strict roles, a context too small) is
answered by the change the profile allows and sent again at once (`chat`). Authentication, quota,
permission, unknown model and other 4xx: non-retryable, so the run pauses with a message naming the
remedy until an operator fixes the configuration and resumes.
"""

from __future__ import annotations

import ast
import difflib
import email.utils
import hashlib
import json
import os
import re
import shlex
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from baselines.external import ExternalProblem, ProblemFileError, entry_source
from baselines.registry import get_problem
from gpu_worker.rules_torch import TORCH_RULE
from workflows.artifacts import ArtifactStore, ArtifactStoreError, candidate_id
from workflows.contracts import (LlmToolRequest, LlmTurnRequest, LlmTurnResult, ToolCall, ToolResult)

HISTORY_TURNS = 4  # past turns replayed verbatim in a prompt (older ones live in the notebook)
MAX_CALLS_PER_TURN = 8
TOOL_CONTENT_CHARS = 6000  # one tool answer of an older turn in a prompt, at most
LAST_TOOL_CONTENT_CHARS = 24000  # one answer to the latest turn: a whole template fits (KDA's is 22.9 k)
READ_LINES_DEFAULT = 480  # lines a read tool returns when no range is asked for

SOURCE_TOOLS = {"submit_kernel", "compile", "check", "benchmark", "profile", "diff_against_best"}
READ_TOOLS = {"read_baseline", "read_oracle", "read_starting_kernel", "read_notebook", "show_best",
              "diff_against_best"}
GPU_TOOLS = {"compile": "compile_candidate", "check": "verify_candidate",
             "benchmark": "benchmark_candidate", "profile": "profile_candidate"}


def _fn(name: str, description: str, props: dict | None = None, required: list[str] | None = None) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props or {}, "required": required or [],
                       "additionalProperties": False}}}


_RANGE = {"start_line": {"type": "integer", "description": "first line to read (1-based; default 1)"},
          "end_line": {"type": "integer", "description": "last line to read (default: 480 lines on)"}}
RANGE_TOOLS = {"read_baseline", "read_oracle", "read_starting_kernel", "read_notebook"}

_SRC = {"source": {"type": "string", "description": "the complete candidate module (Python + Triton)"},
        "candidate_id": {"type": "string", "description": "or: the id of a kernel seen before"}}

TOOLS = [
    _fn("submit_kernel", "Submit a complete candidate module for evaluation: rules, compile, correctness "
        "check, benchmark. Uses one iteration of the budget; a faster correct kernel becomes the best.",
        {"source": _SRC["source"],
         "rationale": {"type": "string", "description": "one line: what this tries and why"}},
        ["source", "rationale"]),
    _fn("compile", "Compile a kernel without submitting it: errors, registers, spills, shared memory.", _SRC),
    _fn("check", "Run the correctness check (all seeds and input distributions) without submitting.", _SRC),
    _fn("benchmark", "Time a kernel against the baseline and the current best, without submitting.", _SRC),
    _fn("profile", "The harness's profile summary of a kernel (compile stats, profiler, what bounds it).",
        _SRC),
    _fn("read_baseline", "Read the source of the baseline the kernels race against (a line range if given).",
        _RANGE),
    _fn("read_oracle", "Read the source of the high-precision oracle the outputs are compared with.", _RANGE),
    _fn("read_starting_kernel", "Read the starting kernel (the problem's template); a line range if given.",
        _RANGE),
    _fn("read_notebook", "Read the run's notebook: what was tried, what failed and why.", _RANGE),
    _fn("show_best", "Show the current best kernel's source and its measurements."),
    _fn("diff_against_best", "A unified diff of a kernel against the current best.", _SRC),
]
TOOL_NAMES = {t["function"]["name"] for t in TOOLS}

SYSTEM_PROMPT = """You are an expert GPU kernel engineer in a long optimization run. You write Triton \
kernels and iterate like an expert: write, compile, check, profile, think, try again. You act only \
through the tools; every kernel you want measured for real goes through submit_kernel.

A candidate is one Python module that defines `run(inputs, out)`: `inputs` maps names to tensors, `out` \
maps output names to preallocated tensors that `run` must fill in place (they are poisoned with NaN \
first). Keep a top-level `KNOBS = {...}` line if you like; it is optional.

Rules (the harness rejects a candidate that breaks one, naming the rule):
- Triton only: no third-party kernel libraries (flash_attn, flashinfer, xformers, fla, liger, cutlass, \
...), no torch.ops / torch.compile / cuBLAS matmuls / the problem's own PyTorch op doing the work.
- """ + TORCH_RULE + """
- Allowed imports: torch, triton, triton.language, math, functools, typing, itertools, operator, \
dataclasses, collections, enum. No os/sys/subprocess/threading/sockets, no exec/eval/getattr/open.
- No CUDA streams, events, graphs or synchronisation games with the timer; no try/except fallbacks; \
no caching keyed by data_ptr/id/storage; no Tensor subclasses or __torch_function__ tricks.
- Results must match the oracle within the problem's tolerance on every seed and input distribution.

Reply with tool calls. Put complete sources in the `source` argument, never a fragment or a diff."""


# ---- the endpoint ----------------------------------------------------------------------------------


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
    tool_mode: str = "auto"  # native | text | auto (native; text once the endpoint refuses tools)
    merge_roles: bool = False  # one message per role in a row: strict chat templates (Gemma, Mistral)
    system_role: bool = True  # False: the system prompt goes at the top of the first user message
    context_tokens: int | None = None  # the endpoint's context window (prompt + reply); None: unknown


PROFILES = {
    "auto": Profile("auto"),
    "openai-chat": Profile("openai-chat", reply_tokens=16384, tool_mode="native"),
    "openai-reasoning": Profile("openai-reasoning", token_param="max_completion_tokens", reply_tokens=32768,
                                reasoning_effort="medium", tool_mode="native"),
    "vllm": Profile("vllm", reply_tokens=8192, merge_roles=True),
    "sglang": Profile("sglang", reply_tokens=8192, merge_roles=True),
    "ollama": Profile("ollama", reply_tokens=4096, merge_roles=True, context_tokens=16384),
    "llamacpp": Profile("llamacpp", reply_tokens=4096, merge_roles=True, context_tokens=16384),
}

PROFILE_ENV = {"token_param": "MARATHON_LLM_TOKEN_PARAM", "reply_tokens": "MARATHON_LLM_MAX_TOKENS",
               "temperature": "MARATHON_LLM_TEMPERATURE", "seed": "MARATHON_LLM_SEED",
               "reasoning_effort": "MARATHON_LLM_REASONING_EFFORT", "tool_mode": "MARATHON_LLM_TOOL_MODE",
               "merge_roles": "MARATHON_LLM_MERGE_ROLES", "system_role": "MARATHON_LLM_SYSTEM_ROLE",
               "context_tokens": "MARATHON_LLM_CONTEXT_TOKENS"}
_NONE = ("", "none", "off", "unset")


def _config_error(text: str) -> ApplicationError:
    return ApplicationError(text, type="LLMConfigError", non_retryable=True)


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
        if field_name in ("merge_roles", "system_role"):
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
        raise _config_error(f"{var}={raw!r} on the agent worker is not valid: expected {hint}") from None


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
        """The profile with what this run has learned from the endpoint applied."""
        known = {k: v for k, v in (adapted or {}).items() if k in Profile.__dataclass_fields__ and k != "name"}
        return replace(self.profile, **known) if known else self.profile

    def where(self) -> str:
        return f"model endpoint {self.base_url or 'api.openai.com'} (model {self.model})"


def endpoint(model: str | None = None, profile: str | None = None) -> Endpoint:
    key = os.environ.get("OPENAI_API_KEY", "")
    name = model or os.environ.get("MARATHON_MODEL", "")
    if not key:
        raise _config_error("OPENAI_API_KEY is not set on the agent worker; set it and `marathon resume`")
    if not name:
        raise _config_error("no model: set MARATHON_MODEL on the agent worker or RunSpec.model")
    pname = (profile or os.environ.get("MARATHON_LLM_PROFILE", "")).strip() or "auto"
    if pname not in PROFILES:
        raise _config_error(f"MARATHON_LLM_PROFILE={pname!r} on the agent worker is not a profile; profiles: "
                            f"{', '.join(PROFILES)}")
    overrides = {f: _env_value(f, os.environ[var]) for f, var in PROFILE_ENV.items() if var in os.environ}
    try:
        timeout = float(os.environ.get("MARATHON_LLM_TIMEOUT", "300"))
        prices = (float(os.environ.get("MARATHON_PRICE_IN", "0")), float(os.environ.get("MARATHON_PRICE_OUT", "0")))
    except ValueError:
        raise _config_error("MARATHON_LLM_TIMEOUT, MARATHON_PRICE_IN and MARATHON_PRICE_OUT must be numbers") from None
    return Endpoint(base_url=os.environ.get("OPENAI_BASE_URL") or None, api_key=key, model=name, timeout=timeout,
                    profile=replace(PROFILES[pname], **overrides), explicit=frozenset(overrides),
                    price_in=prices[0], price_out=prices[1])


_CLIENTS: dict[tuple, object] = {}
_CLIENTS_LOCK = threading.Lock()


def _client(ep: Endpoint):
    from openai import OpenAI

    k = (ep.base_url, ep.api_key, ep.timeout)
    with _CLIENTS_LOCK:
        if k not in _CLIENTS:
            _CLIENTS[k] = OpenAI(base_url=ep.base_url, api_key=ep.api_key, timeout=ep.timeout, max_retries=0)
        return _CLIENTS[k]


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


def estimate_tokens(obj) -> int:
    text = obj if isinstance(obj, str) else json.dumps(obj)
    return len(text) // 4 + 1


def _redact(text: str, ep: Endpoint | None) -> str:
    if ep and ep.api_key:
        text = text.replace(ep.api_key, "[redacted]")
    return re.sub(r"\b(sk-[A-Za-z0-9_\-]{4})[A-Za-z0-9_\-*]+", r"\1...[redacted]", text)


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


_FIX_CONFIG = "Fix the agent worker's configuration (OPENAI_API_KEY, OPENAI_BASE_URL, MARATHON_MODEL), then " \
              "`marathon resume`."


def classify(e: Exception, ep: Endpoint | None) -> ApplicationError:
    """An endpoint failure as the ApplicationError whose retryability Temporal acts on, its message
    naming what fixes it."""
    import openai

    msg = _redact(str(e), ep)[:600]
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
                                        f"OPENAI_API_KEY on the agent worker, then `marathon resume`.",
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
                                    f"worker (and check OPENAI_BASE_URL), then `marathon resume`.",
                                    type="LLMAuthError", non_retryable=True)
        kind = {400: "bad request", 404: "not found (unknown model or wrong OPENAI_BASE_URL?)",
                413: "request too large", 422: "unprocessable request"}.get(code, "client error")
        return ApplicationError(f"{where}: {code} {kind}: {msg}. {_FIX_CONFIG}", type="LLMClientError",
                                non_retryable=True)
    if isinstance(e, ApplicationError):
        return e
    return ApplicationError(f"{where}: {type(e).__name__}: {msg}", type="LLMError")


# What a refusal says, and what fixes it. Matched on the error's text (and `param` where the server
# names one): servers word these differently, and some send them as 500s.
_PARAM_NAMES = ("max_completion_tokens", "max_tokens", "temperature", "seed", "reasoning_effort")
_NO_TOOLS = re.compile(r"does not support tools|tool choice requires|enable-auto-tool-choice|tools? (param|"
                       r"parameter)s? (requires|is not supported)|--jinja|tools are not supported|"
                       r"unsupported parameter:? '?tools|tool(s| calling| use)? (is |are )?not (supported|enabled)",
                       re.I)
_ROLES = re.compile(r"roles must alternate|must alternate (between )?user|conversation roles|"
                    r"after the optional system message", re.I)
_NO_SYSTEM = re.compile(r"system role (is )?not supported|system messages? (is |are )?not supported", re.I)
_CONTEXT = re.compile(r"context[_ ]length[_ ]exceeded|maximum context length|exceeds? the (available )?context|"
                      r"context (window|size|length) (of \d+ tokens )?(is )?exceeded|too many tokens|"
                      r"prompt is too long|input (is )?too long|longer than the model'?s? context", re.I)


def _error_text(e) -> tuple[str, str | None, str | None]:
    """(message, param, code) of an endpoint's error body, whatever its shape."""
    body = getattr(e, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    if isinstance(body, dict):
        m = body.get("message") or body.get("detail") or body.get("error") or json.dumps(body)
        return str(m), (body.get("param") if isinstance(body.get("param"), str) else None), \
            (body.get("code") if isinstance(body.get("code"), str) else None)
    return str(body if body is not None else getattr(e, "message", e)), None, None


def diagnose(e: Exception) -> tuple[str, dict]:
    """What an endpoint's refusal asks for: ("param", {name, replacement}), ("tools", {}), ("roles", {}),
    ("system", {}), ("context", {limit}) or ("other", {})."""
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
    if _NO_TOOLS.search(text) or param in ("tools", "tool_choice"):
        return "tools", {}
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
    """The endpoint refused the prompt as too long even at the smallest size it can be shrunk to."""


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
        except ContextTooSmall:
            raise _context_error(ep, s, adapted) from None
        kwargs = request_kwargs(ep, s, msgs, tools)
        t0 = time.monotonic()
        try:
            raw = _heartbeating(lambda: _client(ep).chat.completions.with_raw_response.create(**kwargs))
        except ApplicationError:
            raise
        except Exception as e:  # noqa: BLE001 - classified: every failure kind maps to a retry decision
            kind, info = diagnose(e)
            change = _adaptation(ep, s, kind, info, e)
            if change is None:
                raise classify(e, ep) from None
            if kind == "context":
                if not change or adapted.get("context_tokens") == change["context_tokens"]:
                    shrink += 1  # no new size named: smaller than last time
                if shrink > MAX_SHRINKS:
                    raise _context_error(ep, s, {**adapted, **change}) from None
            elif len(learned) >= MAX_ADAPTATIONS or all(adapted.get(k) == v for k, v in change.items()):
                raise classify(e, ep) from None  # the change did not help: say what the endpoint said
            line = _describe_change(kind, info, change, s)
            adapted.update(change)
            if line not in learned:
                learned.append(line)
                _log_learned(ep, line)
            continue
        reply = normalise(_raw_json(raw, ep), msgs, ep)
        reply.latency_s = time.monotonic() - t0
        reply.adapted, reply.learned, reply.mode = adapted, learned, ("native" if "tools" in kwargs else "text")
        return reply
    raise _config_error(f"{ep.where()}: refused every variant of the request; run `marathon llm-check`")


def _raw_json(raw, ep: Endpoint) -> dict:
    try:
        data = json.loads(raw.text)
    except (ValueError, TypeError):
        raise ApplicationError(f"{ep.where()}: the reply is not JSON: {_redact(str(raw.text)[:200], ep)}",
                               type="LLMServerError") from None
    if not isinstance(data, dict):
        raise ApplicationError(f"{ep.where()}: the reply is not a JSON object", type="LLMServerError")
    return data


def _adaptation(ep: Endpoint, s: Profile, kind: str, info: dict, e: Exception) -> dict | None:
    """The settings change that answers a refusal, or None (classified as it is). A setting the worker's
    environment fixed is never changed: the refusal pauses the run naming that variable."""
    def fixed(field_name: str) -> bool:
        if field_name in ep.explicit:
            raise _config_error(f"{ep.where()} refused the request: {_redact(_error_text(e)[0], ep)[:300].rstrip('.')}. "
                                f"Change {PROFILE_ENV[field_name]} on the agent worker (it is set to "
                                f"{getattr(s, field_name)!r}), then `marathon resume`.") from None
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
            raise _config_error(f"{ep.where()} does not take tools: {_redact(_error_text(e)[0], ep)[:300].rstrip('.')}. "
                                f"Set MARATHON_LLM_TOOL_MODE=text (or auto) on the agent worker, or start the "
                                f"server with tool calling on (vLLM: --enable-auto-tool-choice "
                                f"--tool-call-parser NAME; SGLang: --tool-call-parser NAME; llama.cpp: --jinja), "
                                f"then `marathon resume`.")
        return {"tool_mode": "text"}
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


def _describe_change(kind: str, info: dict, change: dict, s: Profile) -> str:
    if kind == "param":
        if "token_param" in change:
            return f"the endpoint refuses {info['name']}: sending {change['token_param']} instead"
        return f"the endpoint refuses {info['name']}: not sent"
    if kind == "tools":
        return "the endpoint does not take tools: text tool mode (fenced code and TOOL: lines)"
    if kind == "system":
        return "the endpoint refuses a system message: the system prompt leads the first user message"
    if kind == "roles":
        return ("the endpoint's chat template needs alternating roles: consecutive messages merged"
                if "merge_roles" in change else "the endpoint's chat template needs alternating roles: "
                "no system message either")
    limit = change.get("context_tokens")
    return (f"the prompt exceeded the endpoint's context ({limit} tokens): shrinking it" if limit
            else "the prompt exceeded the endpoint's context: shrinking it")


def _context_error(ep: Endpoint, s: Profile, adapted: dict) -> ApplicationError:
    limit = adapted.get("context_tokens") or s.context_tokens
    return ApplicationError(
        f"{ep.where()}: the prompt does not fit the endpoint's context"
        f"{f' ({limit} tokens)' if limit else ''} even shrunk to its smallest. Lower the run's context_tokens "
        f"(`marathon budget ID --context-tokens N`), or a smaller MARATHON_LLM_MAX_TOKENS, or give the server a "
        f"larger context (MARATHON_LLM_CONTEXT_TOKENS tells the worker its size), then `marathon resume`.",
        type="LLMContextError", non_retryable=True)


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
    in the text, usage present or not. Only a reply without choices is an error."""
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


def cost(ep: Endpoint, tin: int, tout: int) -> float:
    return (tin * ep.price_in + tout * ep.price_out) / 1e6


# ---- sources in replies ----------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)


def extract_code(text: str) -> str | None:
    """The kernel module in a free-text reply: the last fenced Python block that defines `run`, else a
    bare module that does; None if there is none."""
    blocks = [b for lang, b in _FENCE.findall(text) if lang.lower() in ("", "python", "py", "python3")]
    with_run = [b for b in blocks if re.search(r"^def run\(", b, re.M)]
    if with_run:
        return with_run[-1].strip("\n") + "\n"
    if not blocks and re.search(r"^def run\(", text, re.M):
        try:
            ast.parse(text)  # the whole reply is the module
            return text.strip("\n") + "\n"
        except SyntaxError:
            start = re.search(r"^(import|from|@triton|def|KNOBS)\b", text, re.M)
            return text[start.start() if start else 0:].strip("\n") + "\n"
    return None


def clean_source(source: str) -> str:
    """A `source` argument wrapped in markdown fences is unwrapped."""
    if "```" in source:
        code = extract_code(source)
        if code:
            return code
        source = re.sub(r"^```[^\n]*\n?|```\s*$", "", source.strip())
    return source.strip("\n") + "\n"


# ---- tool calls written as text --------------------------------------------------------------------

TEXT_PROTOCOL = """Tools are called in plain text: this endpoint takes no native tool calls. To call a \
tool, write a line

TOOL: <name> [key=value ...]

For submit_kernel, compile, check, benchmark, profile and diff_against_best, put the complete module in a \
```python fenced block right after that line (or give candidate_id=<id> of a kernel seen before). \
submit_kernel takes rationale="one line: what this tries and why". read_baseline, read_oracle, \
read_starting_kernel and read_notebook take start_line=N end_line=M for a part of a long file. Several \
TOOL: lines in one reply are run in order; a reply with a fenced module and no TOOL: line is a \
submission. The tools: """

_TOOL_LINE = re.compile(r"^[ \t>*`]*(?:TOOL|CALL)[ \t]*:[ \t]*`?([A-Za-z_]+)`?[ \t]*(.*)$", re.M)
_CALL_OPEN = re.compile(r"<tool_call>\s*|\[TOOL_CALLS\]\s*|<\|tool_call\|>\s*|<function_call>\s*")
_CALL_CLOSE = re.compile(r"\s*(</tool_call>|<\|/tool_call\|>|</function_call>)")


def _call_of(x) -> dict | None:
    """{"name", "arguments": str} from a tool call object written as JSON, in any of its usual shapes."""
    if not isinstance(x, dict):
        return None
    if isinstance(x.get("function"), dict):
        x = {**x["function"], **{k: v for k, v in x.items() if k != "function"}}
    name = x.get("name")
    if not isinstance(name, str) or not name:
        return None
    args = x.get("arguments", x.get("parameters", {}))
    return {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}


def _protocol_args(rest: str) -> dict:
    rest = rest.strip().strip("`")
    if rest.startswith("{"):
        try:
            obj = json.loads(rest)
            if isinstance(obj, dict):
                return obj
        except json.JSONDecodeError:
            pass
    args: dict = {}
    words = []
    try:
        tokens = shlex.split(rest)
    except ValueError:
        tokens = rest.split()
    for tok in tokens:
        k, eq, v = tok.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_]+", k):
            args[k] = int(v) if k in ("start_line", "end_line") and v.isdigit() else v
        else:
            words.append(tok)
    if "lines" in args and isinstance(args["lines"], str) and re.fullmatch(r"\d+-\d+", args["lines"]):
        a, b = args.pop("lines").split("-")
        args["start_line"], args["end_line"] = int(a), int(b)
    if words and "rationale" not in args:
        args["rationale"] = " ".join(words)
    return args


def _protocol_calls(content: str) -> list[dict]:
    """`TOOL: name key=value ...` lines, each with the fenced module that follows it (before the next)."""
    found = list(_TOOL_LINE.finditer(content))
    calls = []
    for i, m in enumerate(found):
        name, args = m.group(1), _protocol_args(m.group(2))
        segment = content[m.end(): found[i + 1].start() if i + 1 < len(found) else len(content)]
        if name in SOURCE_TOOLS and "source" not in args and "candidate_id" not in args:
            blocks = [b for lang, b in _FENCE.findall(segment) if lang.lower() in ("", "python", "py", "python3")]
            if blocks:
                args["source"] = blocks[0]
        if name == "submit_kernel" and "rationale" not in args:
            r = re.search(r"^\s*rationale\s*:\s*(.+)$", segment, re.M | re.I)
            args["rationale"] = r.group(1).strip() if r else "submitted in text mode"
        calls.append({"name": name, "arguments": json.dumps(args)})
    return calls


def text_tool_calls(content: str) -> tuple[list[dict], str]:
    """Tool calls a model wrote in its reply's text instead of sending them natively: <tool_call>{...}
    </tool_call> (Hermes/Qwen), [TOOL_CALLS][...] (Mistral), a reply that is one JSON call, or this
    project's `TOOL:` lines. Returns (calls with ids, the prose around the JSON calls)."""
    calls: list[dict] = []
    prose = content
    dec = json.JSONDecoder()
    spans = []
    for m in _CALL_OPEN.finditer(content):
        try:
            obj, end = dec.raw_decode(content, m.end())
        except ValueError:
            continue
        got = [c for c in (_call_of(x) for x in (obj if isinstance(obj, list) else [obj])) if c]
        if got:
            calls += got
            close = _CALL_CLOSE.match(content, end)
            spans.append((m.start(), close.end() if close else end))
    for a, b in reversed(spans):
        prose = prose[:a] + prose[b:]
    if not calls:
        body = re.sub(r"^```(?:json)?\s*|\s*```$", "", content.strip())
        if body.startswith(("{", "[")):
            try:
                obj = json.loads(body)
                got = [c for c in (_call_of(x) for x in (obj if isinstance(obj, list) else [obj])) if c]
                if got and all(c["name"] in TOOL_NAMES for c in got):
                    calls, prose = got, ""
            except json.JSONDecodeError:
                pass
    if not calls:
        calls = _protocol_calls(content)
    tag = hashlib.sha256(content.encode()).hexdigest()[:8]
    return [{"id": f"text_{tag}_{i}", **c} for i, c in enumerate(calls)], prose.strip()


def _entry_form(source: str, problem: str) -> str:
    """A problem file's candidate in the entry-function form the harness calls (a `ModelNew` class is
    accepted too, as in KernelBench); built-in problems' candidates as they are."""
    p = get_problem(problem)
    if not isinstance(p, ExternalProblem):
        return source
    try:
        return entry_source(source, p)
    except ProblemFileError:  # the rules and the harness name what is wrong with it
        return source


def _rules(source: str, problem: str) -> str | None:
    try:
        from gpu_worker.rules import check_source
    except ImportError:
        return None
    rep = check_source(source, problem)
    return None if rep.ok else f"{rep.rule}: {rep.detail}"


def parse_calls(reply: Reply, turn: int, problem: str, store: ArtifactStore,
                seen: dict[str, str] | None = None) -> tuple[list[ToolCall], str]:
    """The reply's tool calls as ToolCalls (sources stored, arguments checked), or an implicit
    submission when the reply has code but no tool call, or feedback when it has neither. `seen` maps
    candidate ids evaluated in earlier runs to what came of them: submitting one again is answered."""
    out: list[ToolCall] = []
    cut = reply.finish_reason == "length"
    for i, tc in enumerate(reply.tool_calls):
        cid = tc["id"]
        name = tc["name"]
        if i >= MAX_CALLS_PER_TURN:
            out.append(ToolCall(call_id=cid, name=name or "?", error=f"not executed: at most "
                                f"{MAX_CALLS_PER_TURN} tool calls per turn"))
            continue
        if name not in TOOL_NAMES:
            out.append(ToolCall(call_id=cid, name=name or "?", error=f"unknown tool {name!r}; the tools "
                                f"are: {', '.join(sorted(TOOL_NAMES))}"))
            continue
        raw = tc["arguments"].strip() or "{}"
        try:
            args = json.loads(raw)
        except json.JSONDecodeError as e:
            if cut:
                out.append(ToolCall(call_id=cid, name=name, error="your reply was cut off at the reply limit "
                                    "before this call's arguments were complete; send a shorter reply (fewer "
                                    "calls, less prose, a more compact kernel)"))
                continue
            out.append(ToolCall(call_id=cid, name=name, error=f"the arguments are not valid JSON "
                                f"({e.msg} at line {e.lineno} column {e.colno}); send a JSON object, with "
                                f"newlines and quotes in the source escaped"))
            continue
        if not isinstance(args, dict):
            out.append(ToolCall(call_id=cid, name=name, error="the arguments must be a JSON object"))
            continue
        out.append(_duplicate(_source_call(cid, name, args, problem, store), seen))
    if out:
        return out, _cut_note(reply) if cut else ""
    code = extract_code(reply.content)
    if code:
        call = _source_call(f"text_{turn}", "submit_kernel",
                            {"source": code, "rationale": "code in a reply without a tool call"}, problem, store)
        return [_duplicate(call.model_copy(update={"implicit": True}), seen)], _cut_note(reply) if cut else ""
    if cut:
        return [], _cut_note(reply) + " Nothing was run."
    return [], ("Your reply had no tool call and no kernel code, so nothing was run. Call a tool: "
                "submit_kernel with a complete module, or compile/check/benchmark/profile/read_* first.")


def _cut_note(reply: Reply) -> str:
    return (f"Your last reply was cut off at the reply limit ({reply.tokens_out} tokens) before it was "
            f"complete. Keep replies shorter: one kernel per reply, little prose.")


def _duplicate(call: ToolCall, seen: dict[str, str] | None) -> ToolCall:
    if call.name != "submit_kernel" or call.error or not seen or call.candidate_id not in seen:
        return call
    return call.model_copy(update={"error": f"this exact source was already evaluated: {seen[call.candidate_id]}. "
                                            f"Change something before submitting again."})


_REFERENCE = re.compile(r"^\s*\[kernel ([0-9a-f]{16}): .*\]\s*$", re.S)  # the placeholder, its diff included


def _source_call(cid: str, name: str, args: dict, problem: str, store: ArtifactStore) -> ToolCall:
    small = {k: (v[:300] if isinstance(v, str) else v) for k, v in args.items() if k != "source"}
    src = args.get("source")
    ref = _REFERENCE.match(src) if isinstance(src, str) else None
    if ref:  # the replay's stand-in for an older kernel, sent back: it names that kernel
        if name == "submit_kernel":
            return ToolCall(call_id=cid, name=name, args=small, error=f"`source` is the reference "
                            f"{src.strip()[:80]}, not a module: submit the complete module")
        args, src = {**args, "candidate_id": ref.group(1)}, None
        small["candidate_id"] = ref.group(1)
    if name == "submit_kernel" and not isinstance(src, str):
        return ToolCall(call_id=cid, name=name, args=small,
                        error="submit_kernel needs `source` (the complete module as a string) and `rationale`")
    if name in SOURCE_TOOLS and name != "submit_kernel" and src is None and not args.get("candidate_id"):
        if name == "diff_against_best":
            return ToolCall(call_id=cid, name=name, args=small, error="give `source` or `candidate_id`")
        return ToolCall(call_id=cid, name=name, args=small,
                        error=f"{name} needs `source` (a complete module) or `candidate_id` (a kernel seen before)")
    if isinstance(src, str):
        source = _entry_form(clean_source(src), problem)
        if not source.strip():
            return ToolCall(call_id=cid, name=name, args=small, error="`source` is empty")
        key = store.put_text(source)
        return ToolCall(call_id=cid, name=name, args=small, source_key=key, candidate_id=candidate_id(source),
                        rules_error=_rules(source, problem))
    if src is not None:
        return ToolCall(call_id=cid, name=name, args=small, error="`source` must be a string")
    cand = args.get("candidate_id")
    return ToolCall(call_id=cid, name=name, args=small, candidate_id=str(cand) if cand else None)


# ---- the prompt ------------------------------------------------------------------------------------


def _problem_facts(req: LlmTurnRequest) -> list[str]:
    p = get_problem(req.problem)
    shapes = ", ".join(s.name for s in p.shapes)
    target = req.shape or "the primary GPU shape (or the CPU shape under the interpreter)"
    facts = [f"Problem: {p.name}: {p.description}",
             f"Shapes: {shapes}; CPU/interpreter shape {p.cpu_shape.name}. Timed on: {target}."]
    timed = [x for x in [*p.shapes, p.cpu_shape] if x.name == req.shape] or p.shapes[:1]
    for shape in timed:
        try:
            fl, by = p.flops(shape), p.bytes_moved(shape)
        except (NotImplementedError, KeyError, TypeError, ValueError):
            continue
        dims = ", ".join(f"{k}={v}" for k, v in shape.params.items())
        facts.append(f"Work at {shape.name} ({dims}): {fl / 1e9:.4g} GFLOP and at least {by / 1e6:.4g} MB moved "
                     f"({fl / by:.3g} FLOP/byte); the floor is the slower of moving those bytes at the device's "
                     f"bandwidth and doing those FLOPs at its peak.")
    d = req.device_facts
    if d is not None:  # known once the run's first benchmark on a GPU has come back
        facts.append(f"GPU: {d.device}; measured ceilings {d.bandwidth_tbps:.2f} TB/s device copy and "
                     f"{d.matmul_tflops:.0f} TFLOP/s bf16 matmul; the timed shape's floor at those rates is "
                     f"{d.floor_ms:.4g} ms. Timing is device time (CUDA-graph replay or back to back with the "
                     f"host ahead) on every input distribution; the worst speedup decides; host launch cost "
                     f"is reported apart and counts for nothing.")
    return facts + [
        f"Inputs: see read_starting_kernel / read_baseline. Outputs compared with the oracle: "
        f"{', '.join(p.outputs)}; pass iff rel-RMS error <= max({p.tolerance_floor:g}, "
        f"{p.tolerance_alpha:g} x the baseline's own error)."]


def objective(req: LlmTurnRequest) -> str:
    """The goal, restated in full every turn: iteration 700 aims at the same target as iteration 1. It
    is the same text every turn (what changes is in run_state), so the prompt's start can be cached."""
    return "\n".join(["# Objective", "Make the fastest correct Triton kernel for this problem. Faster than the "
                      "baseline is the minimum; beat the current best.", *_problem_facts(req),
                      "Rules: Triton only; no third-party kernel libraries or library kernels doing the work; "
                      "the harness rejects forbidden imports, exec/eval/getattr, streams/events/graphs, "
                      "try/except fallbacks, pointer-keyed caches, Tensor subclasses, wrong results."])


def run_state(req: LlmTurnRequest) -> str:
    """Where the run stands this turn: the baseline's time, the best, what is left of the budget."""
    b, u, bud = req.best, req.used, req.budget
    lines = ["# Where the run stands"]
    lines.append(f"Baseline time: {req.baseline_ms:.4g} ms" if req.baseline_ms else
                 "Baseline time: not measured yet (the first submission measures it).")
    if b:
        interp = " (interpreter timing on CPU, not GPU speed)" if b.interpreter else ""
        lines.append(f"Current best: {b.candidate_id} from iteration {b.iteration}: {b.speedup:.3f}x the "
                     f"baseline, {b.time_ms:.4g} ms{interp}. A new best needs its whole 95% interval above "
                     f"{b.speedup:.3f}x.")
    else:
        lines.append("Current best: none yet: submit a correct kernel first.")
    left = []
    if bud.iterations is not None:
        left.append(f"{bud.iterations - u.iterations} of {bud.iterations} submissions")
    if bud.tokens is not None:
        left.append(f"{bud.tokens - u.tokens} of {bud.tokens} tokens")
    if bud.hours is not None:
        left.append(f"{max(0.0, bud.hours - u.seconds / 3600):.2f} of {bud.hours} hours")
    if bud.gpu_seconds is not None:
        left.append(f"{bud.gpu_seconds - u.gpu_seconds:.0f} of {bud.gpu_seconds:.0f} GPU-seconds")
    lines.append(f"Remaining budget: {'; '.join(left) or 'unlimited'}. Used so far: {u.iterations} "
                 f"submissions, {u.turns} turns, {u.tool_calls} tool calls.")
    return "\n".join(lines)


def _starting_source(problem: str) -> str | None:
    try:
        return get_problem(problem).template()
    except (OSError, LookupError, ValueError):
        return None


def _template_block(problem: str) -> str:
    try:
        src = (get_problem(problem).folder / "kernel.py").read_text()
    except OSError:
        return ""
    return "# The starting kernel (the problem's template, kernel.py)\n```python\n" + src.rstrip() + "\n```"


def _records_block(req: LlmTurnRequest) -> str:
    if not req.recent:
        return ""
    lines = ["# Latest submissions"]
    for r in req.recent[-8:]:
        what = (f"{r.speedup:.3f}x, {r.time_ms:.4g} ms" if r.speedup is not None
                else f"rejected at {r.stage}: {(r.reason.splitlines() or [''])[0][:160]}")
        lines.append(f"- #{r.iteration} {r.candidate_id} {r.outcome}: {what}; {r.rationale[:100]}")
    return "\n".join(lines)


def _kernels_block(req: LlmTurnRequest, store: ArtifactStore, with_diffs: bool, base: str | None = None) -> str:
    """The best kernel in full (with `base`, the starting kernel, as a diff against it where that is
    shorter: for prompts too small for the whole source), then with_diffs the leaderboard against the best."""
    best_src = None
    lines = []
    if req.best is not None:
        try:
            best_src = store.get_text(req.best.source_key)
        except ArtifactStoreError:
            best_src = None
    if best_src:
        head = f"## 1. {req.best.candidate_id} (the best, {req.best.speedup:.3f}x)"
        same = base is not None and best_src.rstrip() == base.rstrip()
        diff = "".join(difflib.unified_diff(base.splitlines(True), best_src.splitlines(True), "start",
                                            req.best.candidate_id, n=1)) if base and not same else None
        if same:
            lines += ["# Top kernels", head + ": identical to the starting kernel (read_starting_kernel shows it)"]
        elif diff is not None and len(diff) < len(best_src):
            lines += ["# Top kernels", head + ", as a diff against the starting kernel (read_starting_kernel "
                      "shows it)", "```diff", diff.rstrip(), "```"]
        else:
            lines += ["# Top kernels", head, "```python", best_src.rstrip(), "```"]
    if not with_diffs:
        return "\n".join(lines)
    for i, e in enumerate((e for e in req.leaderboard if not req.best or e.candidate_id != req.best.candidate_id),
                          2):
        try:
            src = store.get_text(e.source_key)
        except ArtifactStoreError:
            continue
        if best_src:
            diff = "".join(difflib.unified_diff(best_src.splitlines(True), src.splitlines(True),
                                                "best", e.candidate_id, n=1))
            if len(diff) < len(src):
                lines += [f"## {i}. {e.candidate_id} ({e.speedup:.3f}x), as a diff against the best",
                          "```diff", diff.rstrip(), "```"]
                continue
        lines += [f"## {i}. {e.candidate_id} ({e.speedup:.3f}x)", "```python", src.rstrip(), "```"]
    return "\n".join(lines)


def _load_turns(store: ArtifactStore, head: str | None, n: int) -> list[dict]:
    out = []
    key = head
    while key and len(out) < n:
        entry = store.get_json(key)
        out.append(entry)
        key = entry.get("prev")
    return list(reversed(out))


def _result_text(r: dict | ToolResult, store: ArtifactStore, limit: int) -> str:
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
    import difflib

    changed = [ln for ln in difflib.unified_diff(base.splitlines(), source.splitlines(), lineterm="", n=0)
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    if not changed:
        return "; identical to the starting kernel"
    shown = "\n".join(changed[:DIFF_LINES])
    more = f"\n... {len(changed) - DIFF_LINES} more changed lines" if len(changed) > DIFF_LINES else ""
    return f"; against the starting kernel:\n{shown}{more}\n"


def _compact_source(args_json: str, call: dict | None, base: str | None = None) -> str:
    """A replayed call's arguments with its kernel source replaced by the candidate id and a short diff
    against the starting kernel (older turns)."""
    try:
        args = json.loads(args_json)
    except json.JSONDecodeError:
        return args_json
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
    return _FENCE.sub(sub, content)


def _history_units(turns: list[dict], pending: list[ToolResult], store: ArtifactStore, limit: int,
                   mode: str = "native", last_limit: int | None = None, base: str | None = None) -> list[list[dict]]:
    """Each past turn as a unit of messages: the assistant reply, then its answers (as tool messages,
    or in text mode one user message). Reasoning is never replayed; kernel sources are replayed in full
    only for the latest turn, older ones by candidate id."""
    units = []
    for i, t in enumerate(turns):
        latest = i == len(turns) - 1
        lim = (last_limit or limit) if latest else limit
        answers = [ToolResult.model_validate(r) for r in turns[i + 1]["results"]] if i + 1 < len(turns) \
            else list(pending)
        by_id = {r.call_id: r for r in answers}
        a = t["assistant"]
        calls = a.get("tool_calls") or []
        parsed = {c.get("call_id"): c for c in t.get("calls") or []}
        content = a.get("content") or ""
        if mode == "text":
            body = content if latest else _compact_fences(content, base)
            if calls and not a.get("calls_from_text"):
                body += "".join(f"\nTOOL: {c['name']} " + (c["arguments"] if latest else
                                _compact_source(c["arguments"], parsed.get(c["id"]), base)) for c in calls)
            unit = [{"role": "assistant", "content": body.strip() or "(empty reply)"}]
            texts = [f"## Result of {c['name']} (call {n})\n" +
                     (_result_text(by_id[c["id"]], store, lim) if c["id"] in by_id else "(no result recorded)")
                     for n, c in enumerate(calls, 1)]
        else:
            if a.get("calls_from_text"):
                content = text_tool_calls(content)[1]
            msg: dict = {"role": "assistant", "content": content if latest else _compact_fences(content, base)}
            if calls:
                msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"], "arguments": c["arguments"] if latest else
                                                   _compact_source(c["arguments"], parsed.get(c["id"]), base)}}
                                     for c in calls]
            unit = [msg]
            for c in calls:
                r = by_id.get(c["id"])
                unit.append({"role": "tool", "tool_call_id": c["id"],
                             "content": _result_text(r, store, lim) if r else "(no result recorded)"})
            texts = []
        implicit = [r for r in answers if r.implicit]
        texts += [_result_text(r, store, lim) for r in implicit] + ([t["feedback"]] if t.get("feedback") else [])
        if texts:
            unit.append({"role": "user", "content": "\n\n".join(texts)})
        units.append(unit)
    return units


def system_prompt(mode: str) -> str:
    if mode != "text":
        return SYSTEM_PROMPT
    return (SYSTEM_PROMPT.rsplit("\n\n", 1)[0] + "\n\n" + TEXT_PROTOCOL
            + "; ".join(f"{t['function']['name']} ({t['function']['description']})" for t in TOOLS) + ".")


def build_messages(req: LlmTurnRequest, store: ArtifactStore, mode: str = "native",
                   budget: int | None = None) -> list[dict]:
    """The turn's prompt, within `budget` estimated tokens (default: req.context_tokens, less the tool
    schemas in native mode): system, the objective, the starting kernel and the notebook (the same from
    turn to turn), the last turns, then the run's state. To fit, it sheds the template (keeping the two
    latest turns), old turns, the non-best kernels, the notebook's middle, long tool answers, then the
    best kernel's lines that the starting kernel has too."""
    notebook = ""
    if req.notebook_key:
        try:
            notebook = store.get_text(req.notebook_key)
        except ArtifactStoreError:
            notebook = "(the notebook could not be read)"
    turns = _load_turns(store, req.conversation_key, HISTORY_TURNS)
    hints = req.hints
    past_hints = [h for h in req.standing_hints if h not in hints]
    template = _template_block(req.problem)
    base = _starting_source(req.problem)  # older turns' kernels replay as a diff against it
    call = "call tools" if mode != "text" else "call tools with TOOL: lines"
    tail = []
    if hints:
        tail.append("New hints from the operator (act on them):\n" + "\n".join(f"- {h}" for h in hints))
    if req.turns_per_iteration:
        left = req.turns_per_iteration - req.turns_since_submission
        if left <= max(3, req.turns_per_iteration // 5):
            tail.append(f"Only {left} turn{'s' if left != 1 else ''} left to record a new submission: after "
                        f"{req.turns_per_iteration} turns without one the run stops. Submit a kernel now.")
    if req.best:
        tail.append(f"Goal: beat {req.best.speedup:.3f}x (current best {req.best.candidate_id}) on "
                    f"{req.problem}. Decide your next step and {call}.")
    else:
        tail.append(f"Goal: a correct kernel for {req.problem} faster than the baseline. Decide your next "
                    f"step and {call}.")

    def assemble(n_turns: int, diffs: bool, nb_chars: int | None, tool_limit: int, last_limit: int,
                 with_template: bool, best_as_diff: bool = False) -> list[dict]:
        # What stays the same from turn to turn comes first (system, objective, template, notebook), so a
        # provider's prompt cache covers it; what changes (state, kernels, submissions, hints) comes last.
        stable = [objective(req)]
        if with_template and template:
            stable.append(template)
        if notebook:
            nb = notebook if nb_chars is None or len(notebook) <= nb_chars else (
                notebook[: nb_chars // 2] + "\n...[notebook shortened to fit the prompt]...\n"
                + notebook[-nb_chars // 2:])
            stable.append("# Notebook (compacted memory of this run)\n" + nb)
        state = [f"Turn {req.turn}.", run_state(req)]
        kb = _kernels_block(req, store, diffs, base if best_as_diff else None)
        if kb:
            state.append(kb)
        rb = _records_block(req)
        if rb:
            state.append(rb)
        if past_hints:
            state.append("# Operator hints in force\n" + "\n".join(f"- {h}" for h in past_hints))
        msgs = [{"role": "system", "content": system_prompt(mode)}, {"role": "user", "content": "\n\n".join(stable)}]
        units = _history_units(turns, req.tool_results, store, tool_limit, mode, last_limit, base)
        for u in units[len(units) - n_turns:] if n_turns else []:
            msgs += u
        if (not turns or not n_turns) and req.tool_results:  # answers whose turn is not shown: as text
            msgs.append({"role": "user", "content": "\n\n".join(
                f"{r.name}: {_result_text(r, store, tool_limit)}" for r in req.tool_results)})
        msgs.append({"role": "user", "content": "\n\n".join(state + tail)})
        return msgs

    if budget is None:
        budget = req.context_tokens - (estimate_tokens(TOOLS) if mode != "text" else 0)
    big, small = LAST_TOOL_CONTENT_CHARS, TOOL_CONTENT_CHARS
    # the template goes before the history's oldest turns do, but not before the latest two
    plans = [(n, True, None, small, big, True) for n in range(len(turns), min(2, len(turns)) - 1, -1)]
    plans += [(n, True, None, small, big, False) for n in range(len(turns), 0, -1)]
    plans += [(1, False, None, small, big, False), (1, False, None, small, small, False)]
    plans += [(1, False, c, small, small, False) for c in (8000, 4000, 2000, 800)]
    plans += [(1, False, 800, 1500, 1500, False), (0, False, 400, 500, 500, False)]
    plans += [(1, False, 800, 1500, 1500, False, True), (0, False, 400, 500, 500, False, True)]
    for plan in plans:
        msgs = assemble(*plan)
        if estimate_tokens(msgs) <= budget:
            return msgs
    return msgs  # the smallest plan: the objective and the last step, whatever they cost


# ---- llm-check ---------------------------------------------------------------------------------------

_CHECK_TOOL = _fn("read_notebook", "Read the run's notebook.")


def llm_check(model: str | None = None, profile: str | None = None) -> tuple[bool, list[str]]:
    """One tiny request with the worker's configured endpoint and profile: what works, what was adapted
    (and the setting that makes it so from the start), what to change. (usable, report lines)."""
    try:
        ep = endpoint(model, profile)
    except ApplicationError as e:
        return False, [f"configuration: {e.message}"]
    p = ep.profile
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
        sets = " ".join(f"{PROFILE_ENV[k]}={_env_text(v)}" for k, v in env.items())
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
    ok = bool(reply.tool_calls) and reply.finish_reason != "length"
    lines.append("OK: a run can use this endpoint" if ok else
                 "NOT OK: the model did not call the tool; try another profile or model")
    return ok, lines


def _env_text(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return "none" if v is None else str(v)


# ---- activities ------------------------------------------------------------------------------------


def _store() -> ArtifactStore:
    return ArtifactStore()


def _infra(e: Exception) -> ApplicationError:
    return ApplicationError(str(e), type="ArtifactStoreError", non_retryable=True)


_LEDGER_INDEX: dict[str, dict[str, str]] = {}  # ledger head -> candidate id -> what came of it
_LEDGER_LOCK = threading.Lock()


def ledger_index(store: ArtifactStore, ledger_key: str | None) -> dict[str, str]:
    """Every candidate recorded in the run's ledger (all earlier runs), with a one-line outcome. A
    ledger head names immutable chunks, so the index is kept per head."""
    if not ledger_key:
        return {}
    with _LEDGER_LOCK:
        if ledger_key in _LEDGER_INDEX:
            return _LEDGER_INDEX[ledger_key]
    from activities.ledger import read_ledger

    out: dict[str, str] = {}
    for r in read_ledger(store, ledger_key):
        what = (f"{r.speedup:.3f}x, {r.time_ms:.4g} ms" if r.speedup is not None and r.time_ms is not None
                else f"rejected at {r.stage}: {(r.reason.splitlines() or [''])[0][:200]}")
        out.setdefault(r.candidate_id, f"iteration {r.iteration}: {r.outcome}, {what}")
    with _LEDGER_LOCK:
        if len(_LEDGER_INDEX) > 64:
            _LEDGER_INDEX.clear()
        _LEDGER_INDEX[ledger_key] = out
    return out


PROMPT_FLOOR_TOKENS = 1500  # below this a prompt cannot hold the objective and the last step


def prompt_budget(req: LlmTurnRequest, s: Profile, shrink: int, mode: str) -> int:
    """Estimated tokens the turn's prompt may take: the run's context_tokens, within the endpoint's
    context less the reply cap when that is known, smaller at each shrink after a refusal."""
    budget = req.context_tokens
    if s.context_tokens:
        budget = min(budget, s.context_tokens - (s.reply_tokens or s.context_tokens // 4) - 256)
    if mode != "text":
        budget -= estimate_tokens(TOOLS)
    budget = int(budget * 0.6 ** shrink)
    if budget < PROMPT_FLOOR_TOKENS:
        raise ContextTooSmall()
    return budget


@activity.defn(name="llm_turn")
def llm_turn(req: LlmTurnRequest) -> LlmTurnResult:
    """One model turn: prompt -> reply -> tool calls. The prompt, the raw reply and the answers to the
    previous turn are appended to the conversation (a chain of turn records in the artifact store)."""
    store = _store()
    ep = endpoint(req.model)
    built: dict = {}

    def build(s: Profile, shrink: int) -> list[dict]:
        mode = "text" if s.tool_mode == "text" else "native"
        try:
            msgs = build_messages(req, store, mode, prompt_budget(req, s, shrink, mode))
        except ArtifactStoreError as e:
            raise _infra(e) from e
        built.update(messages=msgs, mode=mode)
        return msgs

    try:
        seen = ledger_index(store, req.ledger_key)
    except ArtifactStoreError as e:
        raise _infra(e) from e
    reply = chat(build, ep, TOOLS, adapted=req.adapted)
    messages = built["messages"]
    try:
        prompt_key = store.put_json({"kind": "llm-prompt", "model": ep.model, "messages": messages,
                                     "tools": [t["function"]["name"] for t in TOOLS] if reply.mode == "native" else [],
                                     "mode": reply.mode})
        try:
            calls, feedback = parse_calls(reply, req.turn, req.problem, store, seen)
        except ArtifactStoreError:
            raise
        except Exception as e:  # noqa: BLE001 - a paid reply is answered and counted, never a traceback
            calls, feedback = [], (f"Your reply could not be read ({type(e).__name__}: {str(e)[:200]}); nothing "
                                   f"was run. Call the tools again.")
        c = cost(ep, reply.tokens_in, reply.tokens_out)
        entry = {"kind": "llm-turn", "prev": req.conversation_key, "workflow_id": req.workflow_id,
                 "turn": req.turn, "iteration": req.iteration, "prompt_key": prompt_key,
                 "results": [r.model_dump(mode="json") for r in req.tool_results], "hints": req.hints,
                 "assistant": {"content": reply.content, "tool_calls": reply.tool_calls,
                               "calls_from_text": reply.calls_from_text, "reasoning": reply.reasoning},
                 "calls": [c_.model_dump(mode="json") for c_ in calls], "feedback": feedback,
                 "usage": {"tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out},
                 "latency_s": round(reply.latency_s, 3), "cost_usd": c, "model": reply.model,
                 "finish_reason": reply.finish_reason, "mode": reply.mode, "learned": reply.learned}
        conv = store.put_json(entry)
    except ArtifactStoreError as e:
        raise _infra(e) from e
    activity.logger.info("llm turn %d: %d in / %d out tokens, %.2f s, %d tool calls", req.turn,
                         reply.tokens_in, reply.tokens_out, reply.latency_s, len(calls))
    prose = _FENCE.sub("[code]", text_tool_calls(reply.content)[1] if reply.calls_from_text else reply.content)
    return LlmTurnResult(conversation_key=conv, prompt_key=prompt_key, text=prose[:500],
                         tool_calls=calls, feedback=feedback, tokens_in=reply.tokens_in,
                         tokens_out=reply.tokens_out, latency_s=reply.latency_s, cost_usd=c, model=reply.model,
                         adapted=reply.adapted, learned=reply.learned)


def line_range(text: str, label: str, args: dict) -> str:
    """Lines start_line..end_line of a file (1-based, inclusive), headed with where they are."""
    lines = text.splitlines()
    try:
        first = max(1, int(args.get("start_line") or 1))
        last = int(args.get("end_line") or first + READ_LINES_DEFAULT - 1)
    except (TypeError, ValueError):
        first, last = 1, READ_LINES_DEFAULT
    last = min(max(first, last), len(lines))
    more = f"; lines {last + 1}-{len(lines)} follow: read them with start_line={last + 1}" if last < len(lines) else ""
    return f"# {label} lines {first}-{last} of {len(lines)}{more}\n" + "\n".join(lines[first - 1:last]) + "\n"


@activity.defn(name="llm_tool")
def llm_tool(req: LlmToolRequest) -> ToolResult:
    """The tools that only read: sources of the problem, the notebook, the best kernel, a diff."""
    call = req.call
    store = _store()
    try:
        folder = get_problem(req.problem).folder
        if call.name in ("read_baseline", "read_oracle", "read_starting_kernel"):
            fname = {"read_baseline": "baseline.py", "read_oracle": "oracle.py",
                     "read_starting_kernel": "kernel.py"}[call.name]
            text = line_range((folder / fname).read_text(), f"{req.problem}/{fname}", call.args)
        elif call.name == "read_notebook":
            text = line_range(store.get_text(req.notebook_key), "notebook", call.args) if req.notebook_key else \
                "No notebook yet: it is written at the first compaction."
        elif call.name == "show_best":
            b = req.best
            if b is None:
                text = "No kernel has passed yet."
            else:
                text = (f"Best: {b.candidate_id} from iteration {b.iteration}: {b.speedup:.3f}x, {b.time_ms:.4g} ms "
                        f"vs baseline {b.baseline_ms:.4g} ms{' (interpreter timing)' if b.interpreter else ''}\n\n"
                        + store.get_text(b.source_key))
        elif call.name == "diff_against_best":
            if req.best is None:
                text = "No best yet to diff against."
            elif not call.source_key:
                return ToolResult(call_id=call.call_id, name=call.name, error=True,
                                  content=f"unknown candidate_id {call.candidate_id!r}")
            else:
                a, b = store.get_text(req.best.source_key), store.get_text(call.source_key)
                text = "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True),
                                                    f"best {req.best.candidate_id}",
                                                    call.candidate_id or "candidate")) or "identical to the best"
        else:
            return ToolResult(call_id=call.call_id, name=call.name, error=True,
                              content=f"{call.name} is not a read-only tool")
        key = store.put_text(text)
    except ArtifactStoreError as e:
        raise _infra(e) from e
    # Only the key goes back: sources stay out of workflow history (the next turn reads the content).
    return ToolResult(call_id=call.call_id, name=call.name, content_key=key, content=f"{len(text)} characters")


LLM_ACTIVITIES = [llm_turn, llm_tool]
