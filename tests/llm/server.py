"""A scripted OpenAI-compatible Chat Completions server for tests: stdlib http.server in a thread.

`respond(body, headers)` decides each reply (a `Reply`: status, JSON body, headers, delay). Every request
is recorded (path, headers, JSON body, the status answered, the time) so tests can assert on prompts.
`Endpoint(kind)` wraps a responder with the refusals of one kind of real server (KINDS): OpenAI's
reasoning models, vLLM or SGLang without tool calling, Ollama, llama.cpp without --jinja, strict chat
templates, small contexts; each refusal worded as that server words it. Some kinds drop the tools without
a word instead, as llama-cpp-python's server does: the responder then sees a request without them.
The probe for dropped tools (activities/llm/probe.py) is answered here with the prompt tokens a server
would count, schemas included where they reach the model; it is not a turn.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 200
    body: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    delay: float = 0.0
    text: str | None = None  # sent as it is instead of `body` (a reply that is not JSON)


@dataclass
class Seen:
    path: str
    headers: dict
    body: dict
    at: float
    status: int = 0
    usage: dict | None = None  # what a 200 reply reported
    served: float | None = None  # when the reply was written (time.monotonic(), as `at`)


def completion(content: str | None = None, calls: list[tuple[str, dict | str]] = (), prompt_tokens: int = 100,
               completion_tokens: int = 20, model: str = "scripted-model", call_ids: list[str] | None = None,
               object_arguments: bool = False, content_parts: bool = False, reasoning_content: str | None = None,
               finish_reason: str | None = None) -> Reply:
    """A 200 reply. object_arguments: `arguments` as a JSON object (some servers); content_parts: content as
    a list of text parts; reasoning_content: the separate reasoning field of vLLM/SGLang/DeepSeek."""
    tool_calls = []
    for i, (name, args) in enumerate(calls):
        a = (json.loads(args) if isinstance(args, str) else args) if object_arguments else \
            (args if isinstance(args, str) else json.dumps(args))
        tool_calls.append({"id": (call_ids[i] if call_ids else f"call_{time.monotonic_ns()}_{i}"),
                           "type": "function", "function": {"name": name, "arguments": a}})
    body_content = [{"type": "text", "text": content}] if content_parts and content is not None else content
    msg: dict = {"role": "assistant", "content": body_content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if reasoning_content is not None:
        msg["reasoning_content"] = reasoning_content
    return Reply(200, {"id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
                       "model": model,
                       "choices": [{"index": 0, "message": msg,
                                    "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop")}],
                       "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                 "total_tokens": prompt_tokens + completion_tokens}})


def error(status: int, message: str, retry_after: float | None = None, code: str | None = None,
          delay: float = 0.0, param: str | None = None, **extra) -> Reply:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return Reply(status, {"error": {"message": message, "type": "scripted", "code": code, "param": param, **extra}},
                 headers, delay)


def is_compaction(body: dict) -> bool:
    """A notebook rewrite (activities/llm/compaction.py), not a model turn: told by its system prompt."""
    return any(isinstance(m.get("content"), str) and "You keep the engineering notebook" in m["content"]
               for m in body.get("messages", [])[:2])


def is_probe(body: dict) -> bool:
    """The one-token probe for whether the tool schemas reach the model, not a model turn."""
    from activities.llm.probe import PROBE_SYSTEM

    return any(m.get("content") == PROBE_SYSTEM for m in body.get("messages", [])[:1])


def probe_reply(body: dict) -> Reply:
    """What a server counts for the probe: its messages, and the schemas where it keeps them."""
    return completion("OK", prompt_tokens=prompt_estimate(body) + 12, completion_tokens=1, finish_reason="length")


def prompt_estimate(body: dict) -> int:
    return len(json.dumps(body.get("messages", []))) // 4 + len(json.dumps(body.get("tools", []))) // 4


@dataclass
class Kind:
    """What one kind of endpoint refuses, and in which words."""

    refuse: dict = field(default_factory=dict)  # parameter -> the error Reply it gets
    tools: Reply | None = None  # set: a request offering tools gets this refusal
    alternate: Reply | None = None  # set: consecutive messages of one role (or a system one) get this
    no_system: Reply | None = None
    context: int | None = None  # refuse a prompt estimate + reply cap above this many tokens
    context_error: str = "openai"  # openai | vllm | llamacpp
    # tools dropped without a word: "always" (a chat format without function calling), "without-choice"
    # (llama-cpp-python's chatml-function-calling: kept only with tool_choice auto or a named function)
    drops_tools: str | None = None
    drops_answers: bool = False  # a tool message rendered without its content (chatml-function-calling)
    required: Reply | None = None  # set: tool_choice "required" gets this


def _openai_unsupported(param: str, instead: str | None) -> Reply:
    tail = f" Use '{instead}' instead." if instead else ""
    return error(400, f"Unsupported parameter: '{param}' is not supported with this model.{tail}",
                 code="unsupported_parameter", param=param)


KINDS = {
    "openai-chat": Kind(),
    "openai-reasoning": Kind(refuse={
        "max_tokens": _openai_unsupported("max_tokens", "max_completion_tokens"),
        "temperature": error(400, "Unsupported value: 'temperature' does not support 0.2 with this model. Only "
                             "the default (1) value is supported.", code="unsupported_value", param="temperature")}),
    "vllm": Kind(),
    "vllm-no-tools": Kind(tools=error(400, '"auto" tool choice requires --enable-auto-tool-choice and '
                                      '--tool-call-parser to be set')),
    "sglang": Kind(),
    "ollama": Kind(tools=error(400, "registry.ollama.ai/library/gemma2:9b does not support tools")),
    "llamacpp": Kind(tools=error(500, "tools param requires --jinja flag"), context=6000, context_error="llamacpp"),
    "strict-template": Kind(alternate=error(400, "Conversation roles must alternate user/assistant/user/assistant/...")),
    "gemma": Kind(alternate=error(400, "Conversation roles must alternate user/assistant/user/assistant/..."),
                  no_system=error(400, "System role not supported")),
    "small-context": Kind(context=6000, context_error="vllm"),
    # llama-cpp-python 0.3.36's server, --chat_format chatml-function-calling: no tool_choice (or "none")
    # renders the prompt without the tools; "required" fails its assertion, an empty 500; a tool message
    # comes out as its role alone
    "llama-cpp-python": Kind(drops_tools="without-choice", drops_answers=True, required=Reply(500, {"error": {
        "message": "", "type": "internal_server_error", "param": None, "code": None}})),
    # the same server with a chat format that has no function calling (the GGUF's own template)
    "llama-cpp-python-own-template": Kind(drops_tools="always"),
}


class Endpoint:
    """A responder behind one kind's refusals: what passes them goes to `respond`."""

    def __init__(self, kind: str, respond) -> None:
        self.kind, self.rules, self.respond = kind, KINDS[kind], respond
        self.refused: list[str] = []

    def __call__(self, body, headers) -> Reply:
        r = self.check(body)
        if r is not None:
            self.refused.append(r.body["error"]["message"])
            return r
        return self.respond(self.shaped(body), headers)

    def probe(self, body) -> Reply:
        return self.check(body) or probe_reply(self.shaped(body))

    def shaped(self, body) -> dict:
        """The request as the model gets it: without its tools where this kind drops them."""
        drop = self.rules.drops_tools
        choice = body.get("tool_choice")
        if self.rules.drops_answers:
            body = {**body, "messages": [{**m, "content": ""} if m.get("role") == "tool" else m
                                         for m in body.get("messages", [])]}
        if drop == "always" or (drop == "without-choice" and (choice is None or choice == "none")):
            return {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
        return body

    def check(self, body) -> Reply | None:
        k = self.rules
        if k.required is not None and body.get("tools") and body.get("tool_choice") == "required":
            return k.required
        for param, reply in k.refuse.items():
            if param in body:
                return reply
        if k.tools is not None and body.get("tools"):
            return k.tools
        msgs = body.get("messages", [])
        if k.no_system is not None and any(m.get("role") == "system" for m in msgs):
            return k.no_system
        if k.alternate is not None:
            roles = [m.get("role") for m in msgs if m.get("role") != "tool"]
            if roles[:1] == ["system"]:
                roles = roles[1:]
            if any(a == b for a, b in zip(roles, roles[1:])) or "system" in roles:
                return k.alternate
        if k.context is not None:
            reply_cap = body.get("max_tokens") or body.get("max_completion_tokens") or 0
            need = prompt_estimate(body) + reply_cap
            if need > k.context:
                if k.context_error == "llamacpp":
                    return error(400, "the request exceeds the available context size, try increasing it",
                                 code=None, n_prompt_tokens=need, n_ctx=k.context)
                return error(400, f"This model's maximum context length is {k.context} tokens. However, you "
                             f"requested {need} tokens ({need - reply_cap} in the messages, {reply_cap} in the "
                             f"completion). Please reduce the length of the messages or completion.",
                             code="context_length_exceeded" if k.context_error == "openai" else None)
        return None


class ChatServer:
    def __init__(self, respond, port: int = 0) -> None:
        self.respond = respond
        self.info: dict[str, dict] = {}  # GET path -> JSON body (a server's /props, /v1/models); else 404
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                body = server.info.get(self.path)
                data = json.dumps(body if body is not None else {"error": f"no route {self.path}"}).encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode(errors="replace")}
                seen = Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                with server.lock:
                    server.seen.append(seen)
                    if self.path.rstrip("/").endswith("/chat/completions"):
                        reply = server.answer(body, seen.headers)
                    else:
                        reply = error(404, f"no route {self.path}")
                    seen.status = reply.status
                    if reply.status == 200:
                        seen.usage = reply.body.get("usage")
                if reply.delay:
                    time.sleep(reply.delay)
                data = (reply.text if reply.text is not None else json.dumps(reply.body)).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.headers.get("Content-Type", "application/json"))
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        if k != "Content-Type":
                            self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                    self.wfile.flush()
                    seen.served = time.monotonic()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler, bind_and_activate=False)
        self.httpd.allow_reuse_address = True
        self.httpd.server_bind()  # bound now (the URL is known), listening only from __enter__: until then
        # a client is refused, like an endpoint that is down
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def answer(self, body, headers) -> Reply:
        if is_probe(body):
            return self.respond.probe(body) if isinstance(self.respond, Endpoint) else probe_reply(body)
        return self.respond(body, headers)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.httpd.server_activate()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- what tests look at ----
    def turns(self) -> list[Seen]:
        """Requests for model turns (not notebook rewrites), in arrival order."""
        with self.lock:
            return [s for s in self.seen if s.path.endswith("/chat/completions") and not is_compaction(s.body)
                    and not is_probe(s.body)]

    def probes(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path.endswith("/chat/completions") and is_probe(s.body)]

    def compactions(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path.endswith("/chat/completions") and is_compaction(s.body)]

    def usage_total(self, which=None) -> tuple[int, int]:
        with self.lock:
            seen = list(which if which is not None else self.seen)
        ok = [s.usage for s in seen if s.status == 200 and s.usage]
        return sum(u["prompt_tokens"] for u in ok), sum(u["completion_tokens"] for u in ok)


def prompt_text(seen: Seen) -> str:
    """All message text of a request, for substring assertions."""
    parts = []
    for m in seen.body.get("messages", []):
        if isinstance(m.get("content"), str):
            parts.append(m["content"])
    return "\n".join(parts)
