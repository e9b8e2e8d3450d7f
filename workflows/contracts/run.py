"""A run: its input (RunSpec), the state one execution carries to the next, the operator's signals, and
what clients see (the status query, the result)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from workflows.contracts.base import GPU_QUEUE, STATE_VERSION, Phase, Strict
from workflows.contracts.budget import Budget, Used
from workflows.contracts.harness import DeviceFacts, ProfileReport
from workflows.contracts.llm import LlmProgress, ToolResult
from workflows.contracts.records import BestRef, BestSummary, IterationRecord, LeaderEntry


class StopRequest(Strict):
    reason: str = "operator"
    # True: the evaluations under way are cancelled rather than waited for, and the best is not verified
    # again (a GPU queue that no worker polls never finishes them)
    now: bool = False


class Hint(Strict):
    text: str

    @field_validator("text")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("hint text is empty")
        return v[:2000]


class Evaluation(Strict):
    """An evaluation started and not yet recorded: its child workflow (EvaluateCandidate) runs on its own
    and signals its result to the run (`evaluated`), so it survives continue-as-new. The run carries this
    entry, not the work: the iteration it was given, the candidate (proposals exclude it) and, once the
    signal has come, the result waiting for its turn to be recorded."""

    iteration: int
    slot: int
    candidate_id: str
    workflow_id: str  # the child workflow's id: a result from another attempt at this iteration is ignored
    record: IterationRecord | None = None
    failure: str | None = None  # an infrastructure failure that outlived the retries: the run pauses
    # a would-be best's record before its best-only checks, and whether the run has answered it (`crown`)
    candidacy: IterationRecord | None = None
    asked: bool = False
    profile: ProfileReport | None = None  # with the result: a new best's profile, where it was asked for
    front: bool = False  # told it is the run's oldest unrecorded iteration (its request, or `front`)


class CarriedState(Strict):
    """Everything a run hands to the next one on continue-as-new: counters, keys, the leaderboard."""

    version: int = STATE_VERSION
    iteration: int = 0  # last iteration fully recorded
    used: Used = Field(default_factory=Used)
    started_at: float = 0.0
    best: BestRef | None = None
    leaderboard: list[LeaderEntry] = Field(default_factory=list)
    notebook_key: str | None = None
    notebook_version: int = 0
    ledger_key: str | None = None  # head of the chain of record chunks in the artifact store
    runs: int = 1  # how many workflow runs (continue-as-new generations) this one is
    hints: list[str] = Field(default_factory=list)  # not yet shown to the proposer
    paused: bool = False
    pause_reason: str = ""
    conversation_key: str | None = None  # llm policy: the transcript lives in the artifact store
    pending_tool_results: list[ToolResult] = Field(default_factory=list)  # llm: for the next turn
    last: IterationRecord | None = None
    evaluations: list[Evaluation] = Field(default_factory=list)  # started, not yet recorded; iteration order
    stop: StopRequest | None = None  # a stop that arrived while the run compacted: the next run ends at once
    llm_adapted: dict = Field(default_factory=dict)  # llm: what the endpoint refused and what replaced it
    turns_since_submission: int = 0  # llm: model turns since the last recorded iteration
    llm_hints: list[str] = Field(default_factory=list)  # llm: hints shown, in force until cleared
    device_facts: DeviceFacts | None = None  # from the latest benchmark on a GPU
    refused: list[str] = Field(default_factory=list)  # the newest signals refused, each with why
    llm_progress: LlmProgress = Field(default_factory=LlmProgress)  # llm: repeats, stalled turns, latest turns


class RunSpec(Strict):
    """The workflow's one input. Everything but `problem` has a default; `carried` is set only by
    continue-as-new."""

    problem: str
    policy: Literal["search", "llm"] = "search"
    budget: Budget = Field(default_factory=Budget)
    compact_every: int = 10
    population: int = 1
    seed: int = 0
    shape: str | None = None  # a shape name of the problem; default: primary on GPU, cpu shape otherwise
    model: str | None = None  # llm policy: overrides MARATHON_MODEL
    context_tokens: int = 24000  # llm policy: cap on a turn's prompt size (estimated tokens)
    # llm policy: model turns allowed without a new iteration recorded; past it the run stops (turn-budget)
    turns_per_iteration: int = 30
    top_k: int = 8
    heartbeat_seconds: int = 60  # a worker that dies mid-activity is noticed after this long
    # the task queue of the GPU workers that evaluate this run: one queue per pool of GPUs (H200s apart
    # from H100s, or one problem per GPU on a shared host); the worker side is `marathon worker --gpu-queue`
    gpu_queue: str = GPU_QUEUE
    # search policy: the artifact key of a starting kernel with KNOBS and KNOB_SPACE (a problem file has no
    # template of its own); default: the problem's template
    start_kernel: str | None = None
    carried: CarriedState | None = None

    @field_validator("problem")
    @classmethod
    def _problem_name(cls, v: str) -> str:
        # a built-in problem's name, or the artifact key of a problem file or folder (baselines/external/)
        kind, sep, key = (v or "").partition(":")
        if sep and kind in ("file", "folder") and len(key) == 64 and all(c in "0123456789abcdef" for c in key):
            return v
        if not v or not v.replace("_", "").isalnum():
            raise ValueError(f"problem must be a problem folder name or a problem file's or folder's key "
                             f"(file:<sha256>, folder:<sha256>), got {v!r}")
        return v

    @field_validator("start_kernel")
    @classmethod
    def _kernel_key(cls, v: str | None) -> str | None:
        if v is not None and (len(v) != 64 or not all(c in "0123456789abcdef" for c in v)):
            raise ValueError(f"start_kernel must be an artifact key (64 hex digits), got {v!r}")
        return v

    @field_validator("gpu_queue")
    @classmethod
    def _queue_name(cls, v: str) -> str:
        if not v or len(v) > 200 or not all(c.isalnum() or c in "-_." for c in v):
            raise ValueError(f"gpu_queue must be a task queue name (letters, digits, - _ .), got {v!r}")
        return v

    @field_validator("compact_every", "population", "top_k", "heartbeat_seconds", "context_tokens",
                     "turns_per_iteration")
    @classmethod
    def _at_least_one(cls, v, info):
        if v < 1:
            raise ValueError(f"{info.field_name} must be at least 1, got {v}")
        return v


class Status(Strict):
    workflow_id: str
    problem: str
    policy: str
    iteration: int
    phase: Phase
    best: BestSummary | None
    budget: Budget
    used: Used
    runs: int
    paused: bool
    pause_reason: str = ""
    stopping: bool = False
    last: IterationRecord | None = None
    notebook_key: str | None = None
    notebook_version: int = 0
    ledger_key: str | None = None
    pending_hints: int = 0
    best_source_key: str | None = None  # the crowned best's kernel source in the artifact store
    stop_reason: str | None = None  # the stop signal's reason, once one has arrived
    refused: list[str] = Field(default_factory=list)  # the newest signals refused, each with why
    llm: LlmProgress | None = None  # llm policy: the latest turns with their calls and verdicts, stalled turns
    gpu_queue: str = ""  # the task queue its candidates' GPU stages go to (RunSpec.gpu_queue)


class RunResult(Strict):
    summary: str = ""  # one line first: what the Web UI shows of a finished run is this result
    workflow_id: str
    problem: str
    iterations: int
    best: BestSummary | None
    best_source_key: str | None = None
    stopped_by: Literal["budget-iterations", "budget-hours", "budget-tokens", "budget-gpu-seconds",
                        "stop-signal", "exhausted", "turn-budget"]
    runs: int
    used: Used
    notebook_key: str | None = None
    ledger_key: str | None = None
    reverified: bool | None = None
    # the stop signal's reason when stopped_by is "stop-signal"; for exhausted and turn-budget, what the model did
    stop_reason: str | None = None
    # the iterations whose evaluations a stop with `now` cancelled under way: not recorded
    cancelled: list[int] = Field(default_factory=list)
