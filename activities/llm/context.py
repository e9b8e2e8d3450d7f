"""The endpoint's context window: what its server says it is, and what to change when a prompt cannot fit.

Where a server reports its context, it is read from there (llama.cpp's llama-server: `/props`
`default_generation_settings.n_ctx`; vLLM, SGLang, OpenRouter and others: the model's `max_model_len` or
`context_length` in `/v1/models`); MARATHON_LLM_CONTEXT_TOKENS overrides it, and a server that says
nothing leaves the profile's. The reply cap follows the context (endpoint.fit_reply), so a prompt always
has room and a reply cut off at the cap still fits the next prompt.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import replace

from activities.llm.endpoint import REPLY_SHARE, Endpoint, Profile
from activities.llm.replies import estimate_tokens
from activities.llm.tools import TOOLS

CONTEXT_MARGIN = 256  # tokens of a known context left free: the chat template's own, the estimate's error
PROBE_SECONDS = 3.0  # per request to the server's information routes
PROBE_TTL = 30.0  # a server restarted with another context is seen again within this long
_PROBED: dict[tuple, tuple[float, int | None]] = {}
_LOCK = threading.Lock()
_CONTEXT_KEYS = ("max_model_len", "n_ctx", "context_length", "context_window", "max_context_length")


def _positive(v) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def from_props(data) -> int | None:
    """llama-server's /props: the context of its slots."""
    if not isinstance(data, dict):
        return None
    dgs = data.get("default_generation_settings")
    return (_positive(dgs.get("n_ctx")) if isinstance(dgs, dict) else None) or _positive(data.get("n_ctx"))


def from_models(data, model: str) -> int | None:
    """/v1/models: the served model's context, where the server lists it (the model named, else the only one)."""
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    items = [m for m in items if isinstance(m, dict)]
    named = [m for m in items if m.get("id") == model] or (items if len(items) == 1 else [])
    for m in named:
        for k in _CONTEXT_KEYS:
            if _positive(m.get(k)):
                return _positive(m.get(k))
    return None


def listed_models(data) -> list[str]:
    """The model ids /v1/models lists; empty where it lists none or not in the OpenAI shape."""
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return []
    return [m["id"] for m in items if isinstance(m, dict) and isinstance(m.get("id"), str)]


def get_json(url: str, key: str):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=PROBE_SECONDS) as r:
            return json.loads(r.read(1 << 22))
    except (OSError, ValueError):  # refused, 404, timed out, not JSON: the server does not say
        return None


def server_context(ep: Endpoint) -> int | None:
    """The context the endpoint's server reports, or None (no such route, no such field, unreachable).
    Kept for PROBE_TTL seconds per endpoint and model."""
    if not ep.base_url:
        return None
    key = (ep.base_url, ep.model)
    with _LOCK:
        hit = _PROBED.get(key)
        if hit is not None and time.monotonic() - hit[0] < PROBE_TTL:
            return hit[1]
    base = ep.base_url.rstrip("/")
    root = base[:-3] if base.endswith("/v1") else base
    found = None
    for url, pick in ((root + "/props", from_props), (base + "/models", lambda d: from_models(d, ep.model))):
        found = pick(get_json(url, ep.api_key))
        if found:
            break
    with _LOCK:
        _PROBED[key] = (time.monotonic(), found)
    return found


def with_server_context(ep: Endpoint) -> Endpoint:
    """The endpoint with the context its server reports, unless MARATHON_LLM_CONTEXT_TOKENS sets it."""
    if "context_tokens" in ep.explicit:
        return ep
    n = server_context(ep)
    return ep if n is None else replace(ep, profile=replace(ep.profile, context_tokens=n))


SERVER_CONTEXT_FLAGS = ("llama.cpp's llama-server -c N, llama-cpp-python --n_ctx N, vLLM --max-model-len N, "
                        "Ollama OLLAMA_CONTEXT_LENGTH=N")


def endpoint_room(s: Profile, shrink: int, mode: str, tools: list[dict] = TOOLS) -> int | None:
    """Estimated tokens a prompt may take within the endpoint's known context (less the reply cap, the
    tool schemas and a margin), smaller at each shrink; None when the context is unknown."""
    if not s.context_tokens:
        return None
    room = s.context_tokens - (s.reply_tokens or s.context_tokens // REPLY_SHARE) - CONTEXT_MARGIN
    if mode != "text":
        room -= estimate_tokens(tools)
    return int(room * 0.6 ** shrink)


def needed_context(prompt_tokens: int) -> int:
    """The smallest context (a multiple of 1024) that holds a prompt of this size and a reply of a quarter
    of the context (the cap a known context gets: endpoint.fit_reply)."""
    n = (prompt_tokens + CONTEXT_MARGIN) * 4 // 3 + 1
    return -(-n // 1024) * 1024


def too_small(ep: Endpoint, s: Profile, needed: int | None, then: str = ", then `marathon resume ID`") -> str:
    """What a prompt that cannot fit the endpoint's context needs, and what would actually help."""
    limit = s.context_tokens
    if not limit or not needed:
        return (f"{ep.where()}: the endpoint refused the prompt as too long even shrunk to its smallest, and "
                f"did not say its context. Start the server with a larger context ({SERVER_CONTEXT_FLAGS}) and "
                f"tell the agent worker its size with MARATHON_LLM_CONTEXT_TOKENS{then}.")
    text = (f"{ep.where()}: the smallest prompt (the objective, the best or starting kernel, the last turn and "
            f"its answers, the tool schemas: about {needed} tokens) and a reply of up to {s.reply_tokens} tokens "
            f"do not fit the endpoint's context of {limit} tokens. ")
    fits = limit - needed - CONTEXT_MARGIN
    if "reply_tokens" in ep.explicit and s.reply_tokens and fits >= 512:
        text += f"Lower MARATHON_LLM_MAX_TOKENS (now {s.reply_tokens}) to {fits} or less, or start "
    else:
        text += "Start "
    text += (f"the server with a context of at least {needed_context(needed)} tokens ({SERVER_CONTEXT_FLAGS})"
             + (" and set MARATHON_LLM_CONTEXT_TOKENS to match" if "context_tokens" in ep.explicit else
                ": the worker reads it from a server that reports it, else set MARATHON_LLM_CONTEXT_TOKENS")
             + f"{then}.")
    return text

