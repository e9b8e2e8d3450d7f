"""The llm policy's exchanges: one model turn, its tool calls and their answers."""

from __future__ import annotations

from pydantic import Field

from workflows.contracts.base import Strict
from workflows.contracts.budget import Budget, Used
from workflows.contracts.harness import DeviceFacts
from workflows.contracts.records import BestRef, IterationRecord, LeaderEntry


class ToolResult(Strict):
    """llm policy: what one tool call gave back, fed to the model in the next turn. Long content lives
    in the artifact store (`content_key`); `content` is short."""

    call_id: str
    name: str
    content: str = ""
    content_key: str | None = None
    error: bool = False
    implicit: bool = False  # answers a reply that had no tool call (fed back as a user message)


class ToolCall(Strict):
    """One tool call the model made. A kernel source in the arguments is replaced by `source_key`
    (the artifact store holds it); `error` set means it is answered with that error, not executed."""

    call_id: str
    name: str
    args: dict = Field(default_factory=dict)
    source_key: str | None = None
    candidate_id: str | None = None
    rules_error: str | None = None  # the static rules reject the source: answered without the GPU
    error: str | None = None
    implicit: bool = False  # code found in a reply without tool calls: treated as a submission


class LlmTurnRequest(Strict):
    workflow_id: str
    problem: str
    shape: str | None = None
    model: str | None = None
    turn: int
    iteration: int  # last recorded iteration
    conversation_key: str | None = None
    notebook_key: str | None = None
    best: BestRef | None = None
    leaderboard: list[LeaderEntry] = Field(default_factory=list)
    recent: list[IterationRecord] = Field(default_factory=list)
    baseline_ms: float | None = None
    budget: Budget
    used: Used
    hints: list[str] = Field(default_factory=list)
    tool_results: list[ToolResult] = Field(default_factory=list)  # answers to the previous turn
    context_tokens: int = 24000
    ledger_key: str | None = None  # earlier runs' records: a submission seen there is a duplicate
    adapted: dict = Field(default_factory=dict)  # endpoint settings learned earlier in the run
    turns_per_iteration: int | None = None
    turns_since_submission: int = 0
    standing_hints: list[str] = Field(default_factory=list)  # shown before, in force until cleared
    device_facts: DeviceFacts | None = None
    submit_only: str = ""  # set: only submit_kernel is offered this turn, and this says why


class LlmTurnResult(Strict):
    conversation_key: str
    prompt_key: str
    text: str = ""  # the reply's prose, trimmed
    tool_calls: list[ToolCall] = Field(default_factory=list)
    feedback: str = ""  # set when the reply had nothing to execute: fed back next turn
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0
    model: str = ""
    adapted: dict = Field(default_factory=dict)  # endpoint settings learned so far, kept for the run
    learned: list[str] = Field(default_factory=list)  # what this turn changed, one line each


class CallView(Strict):
    """One tool call of a turn as `status` and `watch` show it: its verdict once answered."""

    name: str
    verdict: str = ""  # empty while it runs
    error: bool = False


class TurnView(Strict):
    """One model turn as `status` and `watch` show it, from the moment it is asked."""

    turn: int
    asked_at: float  # workflow time (epoch seconds) the turn was asked
    replied: bool = False
    tokens_in: int = 0
    tokens_out: int = 0
    submit_only: bool = False
    calls: list[CallView] = Field(default_factory=list)
    note: str = ""  # a reply with nothing to execute: what it was told


class LlmProgress(Strict):
    """llm policy: whether the model is getting anywhere (carried across continue-as-new). A call that
    fails the same way again and again is answered with what to do instead; turns that bring nothing new
    are `stalled` and end the run as exhausted (workflows/llm_progress.py decides)."""

    failing_call: str = ""  # the signature of the latest call that failed
    failing_times: int = 0  # how many times in a row that call was made and failed
    failing_answer: str = ""  # what it was answered, trimmed
    stalled: int = 0  # consecutive turns that brought nothing new
    last_stall: str = ""  # what the latest stalled turn did, in words
    stop_reason: str = ""  # set when the model's turns end the run: why, in words
    turns: list[TurnView] = Field(default_factory=list)  # the latest few turns, the current one last
    answered: list[str] = Field(default_factory=list)  # the signatures of the latest turn's calls that succeeded
    repeating: int = 0  # consecutive turns that made only the answered calls of the turn before again


class LlmToolRequest(Strict):
    problem: str
    call: ToolCall
    notebook_key: str | None = None
    best: BestRef | None = None
