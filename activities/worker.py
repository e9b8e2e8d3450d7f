"""The agent worker: the KernelOptimization workflow and its EvaluateCandidate children, plus proposer,
rules and compaction activities on task queue marathon-agent."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from temporalio.client import Client
from temporalio.worker import Worker

from activities.agent import AGENT_ACTIVITIES
from workflows.contracts import AGENT_QUEUE
from workflows.evaluation import EvaluateCandidate
from workflows.optimization import KernelOptimization

WORKFLOWS = [KernelOptimization, EvaluateCandidate]


def agent_activities() -> list:
    acts = list(AGENT_ACTIVITIES)
    try:
        from activities.llm.activities import LLM_ACTIVITIES
    except ImportError:  # the llm policy is optional at import time
        LLM_ACTIVITIES = []
    return acts + list(LLM_ACTIVITIES)


def build_agent_worker(client: Client, task_queue: str = AGENT_QUEUE, concurrency: int = 16) -> Worker:
    return Worker(client, task_queue=task_queue, workflows=WORKFLOWS,
                  activities=agent_activities(), activity_executor=ThreadPoolExecutor(concurrency),
                  max_concurrent_activities=concurrency)
