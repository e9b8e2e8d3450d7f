from __future__ import annotations

import pytest_asyncio
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.conftest import temporal_path
from cli.server import dev_server_config_args
from workflows.run_view import SEARCH_ATTRIBUTES

# Suggest continue-as-new early so tests cross run boundaries through the server's own signal too.
SUGGEST_CAN_AT = 400


@pytest_asyncio.fixture(scope="session")
async def env():
    e = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter, dev_server_existing_path=temporal_path(),
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_extra_args=["--dynamic-config-value",
                               f"limit.historyCount.suggestContinueAsNew={SUGGEST_CAN_AT}"]
        + dev_server_config_args())
    yield e
    await e.shutdown()
