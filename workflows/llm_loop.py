"""Policy `llm`: one model turn and its tool calls, each an activity (filled in by the llm policy work)."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError


async def llm_step(wf) -> bool:
    raise ApplicationError("policy 'llm' is not available yet", non_retryable=True)
