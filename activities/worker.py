"""The agent worker: the KernelOptimization workflow and its EvaluateCandidate children, plus proposer,
rules and compaction activities on task queue marathon-agent."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from activities.agent import AgentActivities
from activities.settings import AgentSettings
from workflows.contracts import AGENT_QUEUE
from workflows.evaluation import EvaluateCandidate
from workflows.optimization import KernelOptimization

WORKFLOWS = [KernelOptimization, EvaluateCandidate]


def agent_activities(settings: AgentSettings | None = None) -> list:
    """The agent worker's activities over `settings` (default: read from this process's environment now)."""
    settings = settings or AgentSettings.from_env()
    acts = AgentActivities(settings).all()
    try:
        from activities.llm.activities import LlmActivities
    except ImportError:  # the llm policy is optional at import time
        return acts
    return acts + LlmActivities(settings).all()


def build_agent_worker(client: Client, task_queue: str = AGENT_QUEUE, concurrency: int = 16,
                       settings: AgentSettings | None = None, shutdown_grace_s: float = 0.0) -> Worker:
    """`shutdown_grace_s`: how long its running activities may go on once it is told to stop."""
    return Worker(client, task_queue=task_queue, workflows=WORKFLOWS,
                  activities=agent_activities(settings), activity_executor=ThreadPoolExecutor(concurrency),
                  max_concurrent_activities=concurrency, graceful_shutdown_timeout=timedelta(seconds=shutdown_grace_s))
