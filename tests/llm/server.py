"""A scripted OpenAI-compatible Chat Completions server for tests: stdlib http.server in a thread.

`respond(body, headers)` decides each reply (a `Reply`: status, JSON body, headers, delay). Every request
is recorded (path, headers, JSON body, the status answered, the time) so tests can assert on prompts.
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


@dataclass
class Seen:
    path: str
    headers: dict
    body: dict
    at: float
    status: int = 0
    usage: dict | None = None  # what a 200 reply reported


def completion(content: str | None = None, calls: list[tuple[str, dict | str]] = (), prompt_tokens: int = 100,
               completion_tokens: int = 20, model: str = "scripted-model", call_ids: list[str] | None = None
               ) -> Reply:
    tool_calls = []
    for i, (name, args) in enumerate(calls):
        tool_calls.append({"id": (call_ids[i] if call_ids else f"call_{time.monotonic_ns()}_{i}"),
                           "type": "function",
                           "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}})
    msg: dict = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return Reply(200, {"id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
                       "model": model,
                       "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if tool_calls else "stop"}],
                       "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                 "total_tokens": prompt_tokens + completion_tokens}})


def error(status: int, message: str, retry_after: float | None = None, code: str | None = None,
          delay: float = 0.0) -> Reply:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return Reply(status, {"error": {"message": message, "type": "scripted", "code": code, "param": None}}, headers, delay)


class ChatServer:
    def __init__(self, respond, port: int = 0) -> None:
        self.respond = respond
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

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
                        reply = server.respond(body, seen.headers)
                    else:
                        reply = error(404, f"no route {self.path}")
                    seen.status = reply.status
                    if reply.status == 200:
                        seen.usage = reply.body.get("usage")
                if reply.delay:
                    time.sleep(reply.delay)
                data = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler, bind_and_activate=False)
        self.httpd.allow_reuse_address = True
        self.httpd.server_bind()  # bound now (the URL is known), listening only from __enter__: until then
        # a client is refused, like an endpoint that is down
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

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
        """Requests for model turns (they offer tools), in arrival order."""
        with self.lock:
            return [s for s in self.seen if s.body.get("tools")]

    def compactions(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if "tools" not in s.body and s.path.endswith("/chat/completions")]

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
