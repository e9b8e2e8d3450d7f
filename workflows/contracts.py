"""Pydantic contracts between the workflow, the activities, the CLI and the Web UI.

Everything here is small: kernel sources, logs, prompts and profiles travel as artifact-store keys
(`*_key`, a sha256 hex digest), never as content.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

AGENT_QUEUE = "marathon-agent"
GPU_QUEUE = "marathon-gpu"
WORKFLOW_TYPE = "KernelOptimization"
STATE_VERSION = 2  # the carried state of this workflow version (docs/architecture.md, Versioning)

Phase = Literal[
    "starting", "proposing", "checking", "evaluating", "compiling", "verifying", "benchmarking", "recording",
    "compacting", "paused", "reverifying", "done",
]
Outcome = Literal["improved", "passed", "rejected"]
Stage = Literal["propose", "rules", "compile", "verify", "benchmark", "profile", "sandbox"]
#: the cheating families a rejection can name: a rejection's reason starts with `family:` when it has one
FAMILIES = ("network", "process", "filesystem", "output-cache", "lazy-output", "precomputed", "shape-specific",
            "stream", "timer")


def family_of(text: str | None) -> str | None:
    """The family a rejection's reason (or rule) names by its first word, else None."""
    head = (text or "").split(":", 1)[0].strip()
    return head if head in FAMILIES else None


def explain(e: ValidationError) -> str:
    """A pydantic error as one readable line: `field: message; ...`."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "input"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field {loc!r}")
        else:
            parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


class Strict(BaseModel):
    """Unknown fields are an error: a typo in a RunSpec must not silently become a default."""

    model_config = ConfigDict(extra="forbid")


class Budget(Strict):
    """Limits of a run; None means unlimited. The workflow checks them between steps."""

    iterations: int | None = 30
    hours: float | None = None
    tokens: int | None = None
    gpu_seconds: float | None = None

    @field_validator("iterations", "hours", "tokens", "gpu_seconds")
    @classmethod
    def _positive(cls, v, info):
        if v is not None and not v > 0:
            raise ValueError(f"budget {info.field_name} must be positive, got {v}")
        return v


class BudgetChange(Strict):
    """Argument of the `set_budget` update: only the fields given change."""

    iterations: int | None = None
    hours: float | None = None
    tokens: int | None = None
    gpu_seconds: float | None = None

    @field_validator("iterations", "hours", "tokens", "gpu_seconds")
    @classmethod
    def _positive(cls, v, info):
        if v is not None and not v > 0:
            raise ValueError(f"budget {info.field_name} must be positive, got {v}")
        return v

    @model_validator(mode="after")
    def _something(self):
        if not self.model_fields_set:
            raise ValueError("set_budget needs at least one of iterations, hours, tokens, gpu_seconds")
        return self


class Used(Strict):
    iterations: int = 0
    seconds: float = 0.0  # wall-clock since the first run started, paused time excluded
    paused_seconds: float = 0.0  # wall-clock spent paused (it does not count against the hours budget)
    tokens_in: int = 0
    tokens_out: int = 0
    gpu_seconds: float = 0.0
    cost_usd: float = 0.0
    turns: int = 0  # llm policy: model turns
    tool_calls: int = 0  # llm policy: tool calls the model made (each one activity)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


class BestRef(Strict):
    candidate_id: str
    source_key: str
    speedup: float
    time_ms: float
    baseline_ms: float
    iteration: int
    interpreter: bool = False
    knobs: dict | None = None


class LeaderEntry(Strict):
    candidate_id: str
    source_key: str
    speedup: float
    time_ms: float
    iteration: int
    knobs: dict | None = None


class IterationRecord(Strict):
    """What one evaluated candidate left behind. Small: reasons are trimmed, logs are keys."""

    iteration: int
    slot: int = 0  # index within the population evaluated in parallel
    candidate_id: str
    source_key: str
    knobs: dict | None = None
    rationale: str = ""
    outcome: Outcome
    stage: Stage | None = None  # where it was rejected
    reason: str = ""
    time_ms: float | None = None
    baseline_ms: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    vs_best_ci: tuple[float, float] | None = None  # see BenchReport
    vs_best: str | None = None
    rel_err: float | None = None
    interpreter: bool = False
    gpu_seconds: float = 0.0
    log_key: str | None = None
    deciding_dist: str | None = None  # see BenchReport
    host_ms: float | None = None
    baseline_host_ms: float | None = None
    started_at: float = 0.0  # workflow time, seconds since epoch
    finished_at: float = 0.0
    family: str | None = None  # the cheating family a rejection names (FAMILIES), from its reason

    @model_validator(mode="after")
    def _family(self):
        if self.family is None and self.outcome == "rejected":
            self.family = family_of(self.reason)
        return self


class ToolResult(Strict):
    """llm policy: what one tool call gave back, fed to the model in the next turn. Long content lives
    in the artifact store (`content_key`); `content` is short."""

    call_id: str
    name: str
    content: str = ""
    content_key: str | None = None
    error: bool = False
    implicit: bool = False  # answers a reply that had no tool call (fed back as a user message)


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
    carried: CarriedState | None = None

    @field_validator("problem")
    @classmethod
    def _problem_name(cls, v: str) -> str:
        # a built-in problem's name, or the artifact key of a problem file or folder (baselines/external.py)
        kind, sep, key = (v or "").partition(":")
        if sep and kind in ("file", "folder") and len(key) == 64 and all(c in "0123456789abcdef" for c in key):
            return v
        if not v or not v.replace("_", "").isalnum():
            raise ValueError(f"problem must be a problem folder name or a problem file's or folder's key "
                             f"(file:<sha256>, folder:<sha256>), got {v!r}")
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


# ---- activity contracts -----------------------------------------------------------------------


class Candidate(Strict):
    candidate_id: str  # sha256(source)[:16]
    source_key: str
    knobs: dict | None = None
    parent: str | None = None
    rationale: str = ""


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


class Proposal(Strict):
    candidate: Candidate | None = None  # None: the proposer has nothing new (search space exhausted)
    note: str = ""


class RuleRequest(Strict):
    problem: str
    source_key: str


class RuleReport(Strict):
    ok: bool
    rule: str | None = None
    detail: str = ""
    family: str | None = None  # the rule, when it is one of FAMILIES

    @model_validator(mode="after")
    def _family(self):
        if self.family is None and not self.ok:
            self.family = family_of(self.rule)
        return self


class EvalRequest(Strict):
    problem: str
    candidate_id: str
    source_key: str
    shape: str | None = None
    iteration: int | None = None  # for logs only
    random_shape: bool = False  # verify: also at a shape the harness draws from the problem's random space

    def bench(self, **kw) -> "BenchRequest":
        """The benchmark request for the same candidate (`kw`: BenchRequest's own fields)."""
        return BenchRequest(**self.model_dump(exclude={"random_shape"}), **kw)


class CompileReport(Strict):
    ok: bool
    error: str = ""  # the compiler's message, trimmed, verbatim
    registers: int | None = None
    spills: int | None = None
    shared_bytes: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    tensor_cores: bool | None = None  # wgmma/HGMMA or mma present
    tma: bool | None = None
    kernels: list[str] = Field(default_factory=list)
    interpreter: bool = False
    log_key: str | None = None
    seconds: float = 0.0
    family: str | None = None  # the cheating family a refusal names (FAMILIES), from its error
    # the compiling GPU worker's own task queue: the candidate's later stages go there, to the child it loaded
    worker_queue: str | None = None

    @model_validator(mode="after")
    def _family(self):
        if self.family is None and not self.ok:
            self.family = family_of(self.error)
        return self


class VerifyReport(Strict):
    ok: bool
    stage: Stage = "verify"
    reason: str = ""
    rel_err: float | None = None  # worst over seeds x distributions x outputs
    baseline_rel_err: float | None = None
    threshold: float | None = None
    interpreter: bool = False
    log_key: str | None = None
    seconds: float = 0.0
    family: str | None = None  # the cheating family the rejection names (FAMILIES), from its reason
    # the problem's other shapes on this device, cheapest first: a would-be best is verified on one more
    other_shapes: list[str] = []
    random_shape: str | None = None  # the random shape it was also verified at (EvalRequest.random_shape)

    @model_validator(mode="after")
    def _family(self):
        if self.family is None and not self.ok:
            self.family = family_of(self.reason)
        return self


class Receipt(Strict):
    device: str
    driver: str = ""
    clocks: str = ""
    torch: str = ""
    triton: str = ""
    repetitions: int = 0
    spread: str = ""  # e.g. "IQR 0.41-0.44 ms"
    mode: str = ""  # "cuda-graph", "back-to-back" ("eager" in older records), "interpreter"


class BenchRequest(Strict):
    problem: str
    candidate_id: str
    source_key: str
    shape: str | None = None
    iteration: int | None = None  # for logs only
    best: BestRef | None = None  # measured interleaved when given
    fresh_process: bool = False  # re-measure a new best away from the search process


class DeviceFacts(Strict):
    """The GPU a run is timed on, as its worker measured it: what the roofline floor is made of."""

    device: str
    bandwidth_tbps: float  # measured device-to-device copy (read + write bytes)
    matmul_tflops: float  # measured bf16 matmul rate
    floor_ms: float  # the timed shape's floor at those rates


class DistributionTiming(Strict):
    """One input distribution's figures in a benchmark: device times (medians, ms) of candidate and
    baseline timed interleaved in one mode, and each side's host latency of a synchronous call."""

    dist: str
    time_ms: float
    baseline_ms: float
    speedup: float
    speedup_ci: tuple[float, float]
    best_time_ms: float | None = None
    vs_best_ci: tuple[float, float] | None = None
    host_ms: float | None = None
    baseline_host_ms: float | None = None
    mode: str = ""  # "cuda-graph", "back-to-back", "interpreter"
    samples: int = 0


class BenchReport(Strict):
    """time_ms/baseline_ms/speedup are the deciding distribution's (the worst speedup); speedup_ci and
    vs_best_ci are conservative over all distributions (see gpu_worker.timing.decide)."""

    ok: bool
    stage: Stage = "benchmark"
    reason: str = ""
    time_ms: float | None = None
    baseline_ms: float | None = None
    baseline_name: str = ""
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    best_time_ms: float | None = None  # the current best re-timed in the same session, if given
    # head to head with that best, same session: 95% interval of best time / candidate time, and whose
    # best it was (acceptance, decisions.improves_on)
    vs_best_ci: tuple[float, float] | None = None
    vs_best: str | None = None
    interpreter: bool = False
    receipt: Receipt | None = None
    log_key: str | None = None
    gpu_seconds: float = 0.0
    distributions: list[DistributionTiming] = []
    deciding_dist: str | None = None
    geomean_speedup: float | None = None
    # host latency of a synchronous call (ms), deciding distribution: its own figure, never in a speedup
    host_ms: float | None = None
    baseline_host_ms: float | None = None
    kernel_ms: float | None = None  # profiler kernel time per call, deciding distribution, when cross-checked
    device_facts: DeviceFacts | None = None
    family: str | None = None  # the cheating family the rejection names (FAMILIES), from its reason

    @model_validator(mode="after")
    def _family(self):
        if self.family is None and not self.ok:
            self.family = family_of(self.reason)
        return self


class ProfileReport(Strict):
    ok: bool
    summary: str = ""  # a short text the proposer can use
    bound: Literal["memory", "compute", "latency", "unknown"] = "unknown"
    tool: str = ""
    report_key: str | None = None


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


class CompactResult(Strict):
    notebook_key: str
    notebook_version: int
    ledger_key: str
    tokens_in: int = 0
    tokens_out: int = 0


class EvaluateRequest(Strict):
    """Input of the EvaluateCandidate child workflow: one candidate's whole evaluation (rules, compile,
    verify, benchmark, and the re-measure of a would-be best in a fresh process)."""

    problem: str
    iteration: int
    slot: int = 0
    candidate: Candidate
    best: BestRef | None = None  # measured interleaved with the candidate
    shape: str | None = None
    gpu_queue: str = GPU_QUEUE
    heartbeat_seconds: int = 60
    started_at: float = 0.0  # workflow time the run started it


class EvaluationResult(Strict):
    """What an EvaluateCandidate child signals to its run: the record, or the infrastructure failure that
    outlived the retries (the run pauses; the iteration is tried again on resume)."""

    iteration: int
    workflow_id: str  # the child's own id
    record: IterationRecord | None = None
    failure: str | None = None
    device_facts: DeviceFacts | None = None
    # the record is a candidacy: the candidate would be a new best; the run answers with a CrownDecision
    candidacy: bool = False


class CrownDecision(Strict):
    """The run's answer to a candidacy, taken when it records that iteration: whether it would crown the
    candidate now, and the best as it stands, which the candidate's re-measure meets head to head."""

    crown: bool
    best: BestRef | None = None


# ---- what clients see ---------------------------------------------------------------------------


class BestSummary(Strict):
    candidate_id: str
    speedup: float
    time_ms: float
    baseline_ms: float
    iteration: int
    interpreter: bool = False


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


class RunResult(Strict):
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
    stop_reason: str | None = None  # the stop signal's reason when stopped_by is "stop-signal"


class StopRequest(Strict):
    reason: str = "operator"


class Hint(Strict):
    text: str

    @field_validator("text")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("hint text is empty")
        return v[:2000]


# ---- llm policy: one model turn, its tool calls ------------------------------------------------


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


class LlmToolRequest(Strict):
    problem: str
    call: ToolCall
    notebook_key: str | None = None
    best: BestRef | None = None


# CarriedState names models defined further down
for _m in (CarriedState, RunSpec):
    _m.model_rebuild()
