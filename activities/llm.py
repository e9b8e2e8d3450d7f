"""Policy `llm`: the model turn and the read-only tools, as activities of the agent worker.

`llm_turn` builds the turn's prompt (the objective restated, the notebook, the top-k kernels, the last
few turns, the operator's hints) within a token budget, asks any OpenAI-compatible Chat Completions
endpoint for the next step, stores prompt and reply in the artifact store and returns the tool calls
with kernel sources replaced by artifact keys. The workflow executes every call (each one activity) and
hands the answers to the next turn. `llm_tool` answers the tools that only read.

Configuration comes from the worker's environment, never from workflow input: OPENAI_BASE_URL,
OPENAI_API_KEY, MARATHON_MODEL (RunSpec.model overrides the model name), MARATHON_LLM_TIMEOUT (seconds
per request, default 300), MARATHON_LLM_MAX_TOKENS (reply cap, unset: the server's default),
MARATHON_PRICE_IN / MARATHON_PRICE_OUT (USD per million tokens, for the cost estimate).

The client never retries (max_retries=0): Temporal does, by the error's kind. 429: retryable with the
server's Retry-After as the next delay. 5xx, 408, timeouts, connection errors: retryable with backoff.
Authentication, permission, unknown model and other 4xx: non-retryable, so the run pauses with the
message until an operator fixes the configuration and resumes.
"""

from __future__ import annotations

import ast
import difflib
import email.utils
import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.artifacts import ArtifactStore, ArtifactStoreError
from workflows.contracts import (LlmToolRequest, LlmTurnRequest, LlmTurnResult, ToolCall, ToolResult)

HISTORY_TURNS = 4  # past turns replayed verbatim in a prompt (older ones live in the notebook)
MAX_CALLS_PER_TURN = 8
TOOL_CONTENT_CHARS = 6000  # one tool answer in a prompt, at most

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
    _fn("read_baseline", "Read the source of the baseline the kernels race against."),
    _fn("read_oracle", "Read the source of the high-precision oracle the outputs are compared with."),
    _fn("read_starting_kernel", "Read the starting kernel (the problem's template) in full."),
    _fn("read_notebook", "Read the run's notebook in full: what was tried, what failed and why."),
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
- Allowed imports: torch, triton, triton.language, math, functools, typing, itertools, operator, \
dataclasses, collections, enum. No os/sys/subprocess/threading/sockets, no exec/eval/getattr/open.
- No CUDA streams, events, graphs or synchronisation games with the timer; no try/except fallbacks; \
no caching keyed by data_ptr/id/storage; no Tensor subclasses or __torch_function__ tricks.
- Results must match the oracle within the problem's tolerance on every seed and input distribution.

Reply with tool calls. Put complete sources in the `source` argument, never a fragment or a diff."""


# ---- the endpoint ----------------------------------------------------------------------------------


@dataclass
class Endpoint:
    base_url: str | None
    api_key: str
    model: str
    timeout: float
    max_tokens: int | None
    price_in: float
    price_out: float


def endpoint(model: str | None = None) -> Endpoint:
    key = os.environ.get("OPENAI_API_KEY", "")
    name = model or os.environ.get("MARATHON_MODEL", "")
    if not key:
        raise ApplicationError("OPENAI_API_KEY is not set on the agent worker; set it and `marathon resume`",
                               type="LLMConfigError", non_retryable=True)
    if not name:
        raise ApplicationError("no model: set MARATHON_MODEL on the agent worker or RunSpec.model",
                               type="LLMConfigError", non_retryable=True)
    mt = os.environ.get("MARATHON_LLM_MAX_TOKENS")
    return Endpoint(base_url=os.environ.get("OPENAI_BASE_URL") or None, api_key=key, model=name,
                    timeout=float(os.environ.get("MARATHON_LLM_TIMEOUT", "300")),
                    max_tokens=int(mt) if mt else None,
                    price_in=float(os.environ.get("MARATHON_PRICE_IN", "0")),
                    price_out=float(os.environ.get("MARATHON_PRICE_OUT", "0")))


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


def classify(e: Exception, ep: Endpoint | None) -> ApplicationError:
    """An endpoint failure as the ApplicationError whose retryability Temporal acts on."""
    import openai

    msg = _redact(str(e), ep)[:600]
    where = f"model endpoint {ep.base_url or 'api.openai.com'} (model {ep.model})" if ep else "model endpoint"
    if isinstance(e, openai.APITimeoutError):
        return ApplicationError(f"{where}: request timed out after {ep.timeout if ep else '?'} s",
                                type="LLMTimeout")
    if isinstance(e, openai.APIConnectionError):
        return ApplicationError(f"{where}: connection failed: {msg}", type="LLMConnectionError")
    if isinstance(e, openai.APIStatusError):
        code = e.status_code
        if code == 429:
            body = getattr(e, "body", None)
            err_code = body.get("code") if isinstance(body, dict) else None
            if err_code == "insufficient_quota":  # not transient: waiting does not refill a quota
                return ApplicationError(f"{where}: 429 quota exhausted: {msg}", type="LLMClientError",
                                        non_retryable=True)
            delay = _retry_after(e.response)
            return ApplicationError(f"{where}: 429 rate limited (retry after {delay if delay is not None else '?'} s)",
                                    type="RateLimited",
                                    next_retry_delay=timedelta(seconds=delay) if delay is not None else None)
        if code >= 500 or code in (408, 409):
            return ApplicationError(f"{where}: {code} server error: {msg}", type="LLMServerError")
        kind = {400: "bad request", 401: "authentication failed", 403: "permission denied",
                404: "not found (unknown model or wrong OPENAI_BASE_URL?)", 413: "request too large",
                422: "unprocessable request"}.get(code, "client error")
        return ApplicationError(f"{where}: {code} {kind}: {msg}. Fix the agent worker's configuration "
                                f"(OPENAI_API_KEY, OPENAI_BASE_URL, MARATHON_MODEL), then `marathon resume`.",
                                type="LLMClientError", non_retryable=True)
    if isinstance(e, ApplicationError):
        return e
    return ApplicationError(f"{where}: {type(e).__name__}: {msg}", type="LLMError")


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


def chat(messages: list[dict], ep: Endpoint, tools: list[dict] | None = None,
         max_tokens: int | None = None) -> Reply:
    """One Chat Completions request through the openai client. Raises ApplicationError (classified)."""
    kwargs: dict = {"model": ep.model, "messages": messages}
    if tools:
        kwargs["tools"] = tools
    mt = min(x for x in (ep.max_tokens, max_tokens) if x) if (ep.max_tokens or max_tokens) else None
    if mt:
        kwargs["max_tokens"] = mt
    t0 = time.monotonic()
    try:
        resp = _heartbeating(lambda: _client(ep).chat.completions.create(**kwargs))
    except ApplicationError:
        raise
    except Exception as e:  # noqa: BLE001 - classified: every failure kind maps to a retry decision
        raise classify(e, ep) from None
    latency = time.monotonic() - t0
    if not getattr(resp, "choices", None):
        raise ApplicationError(f"model endpoint returned no choices (model {ep.model})", type="LLMServerError")
    msg = resp.choices[0].message
    calls = []
    for i, tc in enumerate(msg.tool_calls or []):
        fn = getattr(tc, "function", None)
        calls.append({"id": tc.id or f"call_{i}", "name": getattr(fn, "name", "") or "",
                      "arguments": getattr(fn, "arguments", "") or ""})
    usage = resp.usage
    content = msg.content or ""
    tin = usage.prompt_tokens if usage and usage.prompt_tokens is not None else estimate_tokens(messages)
    tout = (usage.completion_tokens if usage and usage.completion_tokens is not None
            else estimate_tokens(content + json.dumps(calls)))
    return Reply(content=content, tool_calls=calls, tokens_in=tin, tokens_out=tout, latency_s=latency,
                 model=resp.model or ep.model, finish_reason=resp.choices[0].finish_reason or "")


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


def _candidate_id(source: str) -> str:
    from activities.search import candidate_id

    return candidate_id(source)


def _rules(source: str, problem: str) -> str | None:
    try:
        from gpu_worker.rules import check_source
    except ImportError:
        return None
    rep = check_source(source, problem)
    return None if rep.ok else f"{rep.rule}: {rep.detail}"


def parse_calls(reply: Reply, turn: int, problem: str, store: ArtifactStore) -> tuple[list[ToolCall], str]:
    """The reply's tool calls as ToolCalls (sources stored, arguments checked), or an implicit
    submission when the reply has code but no tool call, or feedback when it has neither."""
    out: list[ToolCall] = []
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
            out.append(ToolCall(call_id=cid, name=name, error=f"the arguments are not valid JSON "
                                f"({e.msg} at line {e.lineno} column {e.colno}); send a JSON object, with "
                                f"newlines and quotes in the source escaped"))
            continue
        if not isinstance(args, dict):
            out.append(ToolCall(call_id=cid, name=name, error="the arguments must be a JSON object"))
            continue
        out.append(_source_call(cid, name, args, problem, store))
    if out:
        return out, ""
    code = extract_code(reply.content)
    if code:
        call = _source_call(f"text_{turn}", "submit_kernel",
                            {"source": code, "rationale": "code in a reply without a tool call"}, problem, store)
        return [call.model_copy(update={"implicit": True})], ""
    return [], ("Your reply had no tool call and no kernel code, so nothing was run. Call a tool: "
                "submit_kernel with a complete module, or compile/check/benchmark/profile/read_* first.")


def _source_call(cid: str, name: str, args: dict, problem: str, store: ArtifactStore) -> ToolCall:
    small = {k: (v[:300] if isinstance(v, str) else v) for k, v in args.items() if k != "source"}
    src = args.get("source")
    if name == "submit_kernel" and not isinstance(src, str):
        return ToolCall(call_id=cid, name=name, args=small,
                        error="submit_kernel needs `source` (the complete module as a string) and `rationale`")
    if name in SOURCE_TOOLS and name != "submit_kernel" and src is None and not args.get("candidate_id"):
        if name == "diff_against_best":
            return ToolCall(call_id=cid, name=name, args=small, error="give `source` or `candidate_id`")
        return ToolCall(call_id=cid, name=name, args=small,
                        error=f"{name} needs `source` (a complete module) or `candidate_id` (a kernel seen before)")
    if isinstance(src, str):
        source = clean_source(src)
        if not source.strip():
            return ToolCall(call_id=cid, name=name, args=small, error="`source` is empty")
        key = store.put_text(source)
        return ToolCall(call_id=cid, name=name, args=small, source_key=key, candidate_id=_candidate_id(source),
                        rules_error=_rules(source, problem))
    if src is not None:
        return ToolCall(call_id=cid, name=name, args=small, error="`source` must be a string")
    cand = args.get("candidate_id")
    return ToolCall(call_id=cid, name=name, args=small, candidate_id=str(cand) if cand else None)


# ---- the prompt ------------------------------------------------------------------------------------


def _problem_facts(req: LlmTurnRequest) -> list[str]:
    from baselines.registry import get_problem

    p = get_problem(req.problem)
    shapes = ", ".join(s.name for s in p.shapes)
    target = req.shape or "the primary GPU shape (or the CPU shape under the interpreter)"
    return [f"Problem: {p.name}: {p.description}",
            f"Shapes: {shapes}; CPU/interpreter shape {p.cpu_shape.name}. Timed on: {target}.",
            f"Inputs: see read_starting_kernel / read_baseline. Outputs compared with the oracle: "
            f"{', '.join(p.outputs)}; pass iff rel-RMS error <= max({p.tolerance_floor:g}, "
            f"{p.tolerance_alpha:g} x the baseline's own error)."]


def objective(req: LlmTurnRequest) -> str:
    """The goal, restated in full every turn: iteration 700 aims at the same target as iteration 1."""
    b, u, bud = req.best, req.used, req.budget
    lines = ["# Objective", "Make the fastest correct Triton kernel for this problem. Faster than the "
             "baseline is the minimum; beat the current best.", *_problem_facts(req)]
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
    lines.append("Rules: Triton only; no third-party kernel libraries or library kernels doing the work; "
                 "the harness rejects forbidden imports, exec/eval/getattr, streams/events/graphs, "
                 "try/except fallbacks, pointer-keyed caches, Tensor subclasses, wrong results.")
    return "\n".join(lines)


def _records_block(req: LlmTurnRequest) -> str:
    if not req.recent:
        return ""
    lines = ["# Latest submissions"]
    for r in req.recent[-8:]:
        what = (f"{r.speedup:.3f}x, {r.time_ms:.4g} ms" if r.speedup is not None
                else f"rejected at {r.stage}: {(r.reason.splitlines() or [''])[0][:160]}")
        lines.append(f"- #{r.iteration} {r.candidate_id} {r.outcome}: {what}; {r.rationale[:100]}")
    return "\n".join(lines)


def _kernels_block(req: LlmTurnRequest, store: ArtifactStore, with_diffs: bool) -> str:
    best_src = None
    lines = []
    if req.best is not None:
        try:
            best_src = store.get_text(req.best.source_key)
        except ArtifactStoreError:
            best_src = None
    if best_src:
        lines += [f"# Top kernels", f"## 1. {req.best.candidate_id} (the best, {req.best.speedup:.3f}x)",
                  "```python", best_src.rstrip(), "```"]
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
        text = text[:limit] + f"\n...[{len(text) - limit} more characters; ask again for a narrower view]"
    return ("ERROR: " + text) if r.error else text


def _history_units(turns: list[dict], pending: list[ToolResult], store: ArtifactStore, limit: int
                   ) -> list[list[dict]]:
    """Each past turn as a unit of messages: the assistant reply, then its answers."""
    units = []
    for i, t in enumerate(turns):
        answers = [ToolResult.model_validate(r) for r in turns[i + 1]["results"]] if i + 1 < len(turns) \
            else list(pending)
        by_id = {r.call_id: r for r in answers}
        a = t["assistant"]
        msg: dict = {"role": "assistant", "content": a.get("content") or ""}
        if a.get("tool_calls"):
            msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for c in a["tool_calls"]]
        unit = [msg]
        for c in a.get("tool_calls") or []:
            r = by_id.get(c["id"])
            unit.append({"role": "tool", "tool_call_id": c["id"],
                         "content": _result_text(r, store, limit) if r else "(no result recorded)"})
        implicit = [r for r in answers if r.implicit]
        if implicit or t.get("feedback"):
            text = "\n\n".join([_result_text(r, store, limit) for r in implicit] +
                               ([t["feedback"]] if t.get("feedback") else []))
            unit.append({"role": "user", "content": text})
        units.append(unit)
    return units


def build_messages(req: LlmTurnRequest, store: ArtifactStore) -> list[dict]:
    """The turn's prompt, within req.context_tokens (estimated): shed old turns first, then the
    non-best kernels, then the notebook's middle, then long tool answers."""
    notebook = ""
    if req.notebook_key:
        try:
            notebook = store.get_text(req.notebook_key)
        except ArtifactStoreError:
            notebook = "(the notebook could not be read)"
    turns = _load_turns(store, req.conversation_key, HISTORY_TURNS)
    past_hints = [h for t in turns for h in t.get("hints", [])]
    hints = req.hints
    final = [f"Turn {req.turn}."]
    if hints:
        final.append("New hints from the operator (act on them):\n" + "\n".join(f"- {h}" for h in hints))
    if req.best:
        final.append(f"Goal: beat {req.best.speedup:.3f}x (current best {req.best.candidate_id}) on "
                     f"{req.problem}. Decide your next step and call tools.")
    else:
        final.append(f"Goal: a correct kernel for {req.problem} faster than the baseline. Decide your next "
                     f"step and call tools.")

    def assemble(n_turns: int, diffs: bool, nb_chars: int | None, tool_limit: int) -> list[dict]:
        parts = [objective(req)]
        if notebook:
            nb = notebook if nb_chars is None or len(notebook) <= nb_chars else (
                notebook[: nb_chars // 2] + "\n...[notebook shortened to fit the prompt]...\n"
                + notebook[-nb_chars // 2:])
            parts.append("# Notebook (compacted memory of this run)\n" + nb)
        kb = _kernels_block(req, store, diffs)
        if kb:
            parts.append(kb)
        rb = _records_block(req)
        if rb:
            parts.append(rb)
        if past_hints:
            parts.append("# Earlier operator hints\n" + "\n".join(f"- {h}" for h in past_hints))
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]
        units = _history_units(turns, req.tool_results, store, tool_limit)
        for u in units[len(units) - n_turns:] if n_turns else []:
            msgs += u
        if not turns and req.tool_results:  # answers whose turn is gone (should not happen): show as text
            msgs.append({"role": "user", "content": "\n\n".join(
                f"{r.name}: {_result_text(r, store, tool_limit)}" for r in req.tool_results)})
        msgs.append({"role": "user", "content": "\n\n".join(final)})
        return msgs

    tools_cost = estimate_tokens(TOOLS)
    budget = req.context_tokens - tools_cost
    plans = [(n, True, None, TOOL_CONTENT_CHARS) for n in range(len(turns), 0, -1)]
    plans += [(1, False, None, TOOL_CONTENT_CHARS)]
    plans += [(1, False, c, TOOL_CONTENT_CHARS) for c in (8000, 4000, 2000, 800)]
    plans += [(1, False, 800, 1500), (0, False, 400, 500)]
    for plan in plans:
        msgs = assemble(*plan)
        if estimate_tokens(msgs) <= budget:
            return msgs
    return msgs  # the smallest plan: the objective and the last step, whatever they cost


# ---- activities ------------------------------------------------------------------------------------


def _store() -> ArtifactStore:
    return ArtifactStore()


def _infra(e: Exception) -> ApplicationError:
    return ApplicationError(str(e), type="ArtifactStoreError", non_retryable=True)


@activity.defn(name="llm_turn")
def llm_turn(req: LlmTurnRequest) -> LlmTurnResult:
    """One model turn: prompt -> reply -> tool calls. The prompt, the raw reply and the answers to the
    previous turn are appended to the conversation (a chain of turn records in the artifact store)."""
    store = _store()
    ep = endpoint(req.model)
    try:
        messages = build_messages(req, store)
        prompt_key = store.put_json({"kind": "llm-prompt", "model": ep.model, "messages": messages,
                                     "tools": [t["function"]["name"] for t in TOOLS]})
    except ArtifactStoreError as e:
        raise _infra(e) from e
    remaining = req.budget.tokens - req.used.tokens if req.budget.tokens is not None else None
    max_out = max(256, remaining - estimate_tokens(messages)) if remaining is not None else None
    reply = chat(messages, ep, TOOLS, max_tokens=max_out)
    try:
        calls, feedback = parse_calls(reply, req.turn, req.problem, store)
        c = cost(ep, reply.tokens_in, reply.tokens_out)
        entry = {"kind": "llm-turn", "prev": req.conversation_key, "workflow_id": req.workflow_id,
                 "turn": req.turn, "iteration": req.iteration, "prompt_key": prompt_key,
                 "results": [r.model_dump(mode="json") for r in req.tool_results], "hints": req.hints,
                 "assistant": {"content": reply.content, "tool_calls": reply.tool_calls},
                 "calls": [c_.model_dump(mode="json") for c_ in calls], "feedback": feedback,
                 "usage": {"tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out},
                 "latency_s": round(reply.latency_s, 3), "cost_usd": c, "model": reply.model,
                 "finish_reason": reply.finish_reason}
        conv = store.put_json(entry)
    except ArtifactStoreError as e:
        raise _infra(e) from e
    activity.logger.info("llm turn %d: %d in / %d out tokens, %.2f s, %d tool calls", req.turn,
                         reply.tokens_in, reply.tokens_out, reply.latency_s, len(calls))
    prose = _FENCE.sub("[code]", reply.content)  # history gets the prose; code lives in the store
    return LlmTurnResult(conversation_key=conv, prompt_key=prompt_key, text=prose[:500],
                         tool_calls=calls, feedback=feedback, tokens_in=reply.tokens_in,
                         tokens_out=reply.tokens_out, latency_s=reply.latency_s, cost_usd=c, model=reply.model)


@activity.defn(name="llm_tool")
def llm_tool(req: LlmToolRequest) -> ToolResult:
    """The tools that only read: sources of the problem, the notebook, the best kernel, a diff."""
    from baselines.registry import get_problem

    call = req.call
    store = _store()
    try:
        folder = get_problem(req.problem).folder
        if call.name in ("read_baseline", "read_oracle", "read_starting_kernel"):
            fname = {"read_baseline": "baseline.py", "read_oracle": "oracle.py",
                     "read_starting_kernel": "kernel.py"}[call.name]
            text = f"# {req.problem}/{fname}\n" + (folder / fname).read_text()
        elif call.name == "read_notebook":
            text = store.get_text(req.notebook_key) if req.notebook_key else \
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
