from __future__ import annotations

import pytest
import pytest_asyncio
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.conftest import temporal_path
from workflows.run_view import SEARCH_ATTRIBUTES

SUGGEST_CAN_AT = 400  # the server suggests continue-as-new early, so runs cross that boundary too


@pytest_asyncio.fixture(scope="session")
async def env():
    e = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter, dev_server_existing_path=temporal_path(),
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_extra_args=["--dynamic-config-value",
                               f"limit.historyCount.suggestContinueAsNew={SUGGEST_CAN_AT}"])
    yield e
    await e.shutdown()


@pytest.fixture
def llm_env(monkeypatch):
    """Point the agent worker's openai client at a scripted server: `llm_env(server)`."""

    def point(server, key: str = "test-key-0123", model: str = "scripted-model", timeout: float = 5.0):
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", key)
        monkeypatch.setenv("MARATHON_MODEL", model)
        monkeypatch.setenv("MARATHON_LLM_TIMEOUT", str(timeout))
        monkeypatch.setenv("MARATHON_PRICE_IN", "1.0")
        monkeypatch.setenv("MARATHON_PRICE_OUT", "4.0")
        return monkeypatch

    return point
