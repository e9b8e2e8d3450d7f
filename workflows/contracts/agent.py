"""The agent worker's search and compaction activities: a proposal, and the notebook and ledger at a
compaction."""

from __future__ import annotations

from pydantic import Field

from workflows.contracts.base import Strict
from workflows.contracts.harness import Candidate
from workflows.contracts.llm import ToolResult
from workflows.contracts.records import BestRef, IterationRecord, LeaderEntry


class ProposeRequest(Strict):
    problem: str
    policy: str
    seed: int
    iteration: int
    slot: int = 0
    shape: str | None = None
    leaderboard: list[LeaderEntry] = Field(default_factory=list)
    recent: list[IterationRecord] = Field(default_factory=list)  # this run's records
    ledger_key: str | None = None
    notebook_key: str | None = None
    hints: list[str] = Field(default_factory=list)
    taken: list[str] = Field(default_factory=list)  # candidate ids proposed by sibling slots this step
    start_kernel: str | None = None  # RunSpec.start_kernel


class Proposal(Strict):
    candidate: Candidate | None = None  # None: the proposer has nothing new (search space exhausted)
    note: str = ""
    refused_hints: list[str] = Field(default_factory=list)  # why each hint shown could not steer it


class CompactRequest(Strict):
    workflow_id: str
    problem: str
    policy: str
    model: str | None = None
    run: int
    records: list[IterationRecord]
    notebook_key: str | None = None
    notebook_version: int = 0
    ledger_key: str | None = None
    best: BestRef | None = None
    final: bool = False
    adapted: dict = Field(default_factory=dict)  # llm policy: endpoint settings the run has learned
    hints: list[str] = Field(default_factory=list)  # llm policy: operator hints in force, for the notebook
    conversation_key: str | None = None  # llm policy: the turns whose tool results the notebook sums up
    tool_results: list[ToolResult] = Field(default_factory=list)  # llm policy: answers to the latest turn
    stopped_by: str | None = None  # the final compaction: why the run ends (a budget stop caps the rewrite)


class CompactResult(Strict):
    notebook_key: str
    notebook_version: int
    ledger_key: str
    tokens_in: int = 0
    tokens_out: int = 0
