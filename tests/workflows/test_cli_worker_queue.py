"""The GPU worker's task queue as `marathon worker` takes it: --gpu-queue, MARATHON_GPU_QUEUE, the default."""

from __future__ import annotations

import os
import subprocess

import pytest

from cli.errors import UsageError
from cli.workers import worker_queue
from tests.workflows.test_cli import MARATHON


def test_the_flag_then_the_variable_then_the_shared_queue():
    assert worker_queue("h100", {"MARATHON_GPU_QUEUE": "h200"}) == "h100"
    assert worker_queue(None, {"MARATHON_GPU_QUEUE": "h200"}) == "h200"
    assert worker_queue(None, {"MARATHON_GPU_QUEUE": ""}) == "marathon-gpu"  # empty is unset
    assert worker_queue(None, {}) == "marathon-gpu"


def test_an_empty_flag_is_refused_not_taken_for_the_shared_queue():
    with pytest.raises(UsageError, match="invalid --gpu-queue: .*got ''"):
        worker_queue("", {})


def test_a_bad_variable_is_named_as_the_variable():
    with pytest.raises(UsageError, match="invalid MARATHON_GPU_QUEUE: .*got 'a b'"):
        worker_queue(None, {"MARATHON_GPU_QUEUE": "a b"})


@pytest.mark.parametrize("role, flag, env, message", [
    ("gpu", ["--gpu-queue", ""], {}, "marathon: error: invalid --gpu-queue: "),
    ("gpu", [], {"MARATHON_GPU_QUEUE": "a b"}, "marathon: error: invalid MARATHON_GPU_QUEUE: "),
    ("agent", ["--gpu-queue", "h100"], {}, "marathon: error: --gpu-queue is a GPU worker's"),
])
def test_the_worker_says_so_in_one_line_before_connecting(role, flag, env, message):
    env = {**os.environ, "TEMPORAL_ADDRESS": "127.0.0.1:1", **env}
    p = subprocess.run(MARATHON + ["worker", "--role", role, *flag], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), p.stderr


def test_an_agent_worker_says_at_start_what_is_wrong_with_its_llm_settings():
    """A search run needs no model endpoint, so the worker starts; the bad variable is named before it
    connects (here to nothing), where an llm-policy run would learn it only at its first turn, paused."""
    env = {**os.environ, "TEMPORAL_ADDRESS": "127.0.0.1:1", "MARATHON_LLM_TIMEOUT": "soon"}
    p = subprocess.run(MARATHON + ["worker", "--role", "agent"], capture_output=True, text=True, env=env,
                       timeout=120)
    lines = p.stderr.strip().splitlines()
    assert lines[0].startswith("marathon: warning: MARATHON_LLM_TIMEOUT, MARATHON_PRICE_IN and MARATHON_PRICE_OUT "
                               "must be numbers") and "runs of the llm policy pause" in lines[0], p.stderr
    assert p.returncode == 2 and "127.0.0.1:1" in lines[-1], p.stderr  # then the connection's own error
    env.pop("MARATHON_LLM_TIMEOUT")
    p = subprocess.run(MARATHON + ["worker", "--role", "agent"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert "warning" not in p.stderr and p.returncode == 2, p.stderr
