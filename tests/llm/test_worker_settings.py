"""The agent worker reads its settings once, when it is built: the endpoint and the artifact store its
activities use do not follow the environment afterwards, and an invalid variable fails the llm
activities with its own message while the search policy's keep working."""

from __future__ import annotations

import os
import socket

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agent import AgentActivities
from activities.llm.activities import LlmActivities
from activities.settings import AgentSettings
from tests.llm.server import ChatServer, completion
from tests.llm.test_endpoints import turn_req
from workflows.artifacts import ArtifactStore
from workflows.contracts import RuleReport, RuleRequest

KERNEL = "import triton\n"


def test_the_endpoint_is_the_one_configured_when_the_worker_was_built(store, llm_env):
    with ChatServer(lambda body, headers: completion("", [("read_baseline", {})])) as server:
        llm_env(server).setenv("MARATHON_LLM_MAX_TOKENS", "777")
        acts = LlmActivities(AgentSettings.from_env())
        # what a shell or a test might change in the worker's process after it started
        llm_env(server).setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        llm_env(server).setenv("MARATHON_LLM_MAX_TOKENS", "not a number")
        res = ActivityEnvironment().run(acts.llm_turn, turn_req())
        (seen,) = server.turns()
    assert [c.name for c in res.tool_calls] == ["read_baseline"]
    assert seen.body["max_tokens"] == 777


def test_an_invalid_variable_fails_every_llm_activity_with_its_message(store, llm_env):
    with ChatServer(lambda body, headers: completion("", [("read_baseline", {})])) as server:
        llm_env(server).setenv("MARATHON_LLM_TOOL_MODE", "sometimes")
        settings = AgentSettings.from_env()
        with pytest.raises(ApplicationError) as e:
            ActivityEnvironment().run(LlmActivities(settings).llm_turn, turn_req())
        assert server.turns() == []  # nothing was sent
    assert e.value.type == "LLMConfigError" and e.value.non_retryable
    assert e.value.message.endswith(f"[agent worker {os.getpid()}@{socket.gethostname()}]")  # which of them
    assert "MARATHON_LLM_TOOL_MODE='sometimes' on the agent worker is not valid: expected native, text or auto" \
        in e.value.message
    # the search policy's activities on the same worker are unaffected
    key = store.put_text(KERNEL)
    report = ActivityEnvironment().run(AgentActivities(settings).check_rules,
                                       RuleRequest(source_key=key, problem="softmax"))
    assert isinstance(report, RuleReport)


def test_the_artifact_store_is_the_one_configured_when_the_worker_was_built(tmp_path, monkeypatch):
    first, later = ArtifactStore(tmp_path / "first"), ArtifactStore(tmp_path / "later")
    monkeypatch.setenv("MARATHON_ARTIFACTS", str(first.root))
    acts = AgentActivities(AgentSettings.from_env())
    monkeypatch.setenv("MARATHON_ARTIFACTS", str(later.root))
    key = first.put_text(KERNEL)
    ActivityEnvironment().run(acts.check_rules, RuleRequest(source_key=key, problem="softmax"))
    missing = later.put_text(KERNEL + "# only in the later store\n")
    with pytest.raises(ApplicationError, match="not found under .*first"):
        ActivityEnvironment().run(acts.check_rules, RuleRequest(source_key=missing, problem="softmax"))
