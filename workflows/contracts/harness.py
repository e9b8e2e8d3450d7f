"""A candidate's evaluation on the GPU worker: the requests of each stage and what each stage reports."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from workflows.contracts.base import GPU_QUEUE, Stage, Strict, Verdict
from workflows.contracts.records import BestRef, IterationRecord


class Candidate(Strict):
    candidate_id: str  # sha256(source)[:16]
    source_key: str
    knobs: dict | None = None
    parent: str | None = None
    rationale: str = ""


class RuleRequest(Strict):
    problem: str
    source_key: str


class RuleReport(Verdict):
    family_text = "rule"

    ok: bool
    rule: str | None = None
    detail: str = ""
    family: str | None = None  # the rule, when it is one of FAMILIES


class EvalRequest(Strict):
    problem: str
    candidate_id: str
    source_key: str
    shape: str | None = None
    iteration: int | None = None  # for logs only
    random_shape: bool = False  # verify: also at a shape the harness draws from the problem's random space
    # compile: the candidate's verification follows on this worker, so its child waits for it there (the
    # worker admits compiles while such children leave room); a compile tool's draft keeps its child parked
    next_stage: bool = False

    def bench(self, **kw) -> "BenchRequest":
        """The benchmark request for the same candidate (`kw`: BenchRequest's own fields)."""
        return BenchRequest(**self.model_dump(exclude={"random_shape", "next_stage"}), **kw)


class CompileReport(Verdict):
    family_text = "error"

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


class VerifyReport(Verdict):
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


class Receipt(Strict):
    device: str
    driver: str = ""
    clocks: str = ""
    torch: str = ""
    triton: str = ""
    repetitions: int = 0
    spread: str = ""  # e.g. "IQR 0.41-0.44 ms"
    mode: str = ""  # "cuda-graph", "back-to-back" ("eager" in older records), "interpreter"
    proof: str = ""  # the ncu proof's line (gpu_worker.harness.ncu_proof); "" when none was drawn
    baseline_env: str = ""  # what the baseline ran with (Problem.baseline_env), e.g. FLA's autotuning source


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


class BenchReport(Verdict):
    """time_ms/baseline_ms/speedup are the deciding distribution's (the worst speedup); speedup_ci is
    conservative over all distributions, vs_best_ci compares worst speedups (see gpu_worker.timing.decide)."""

    ok: bool
    stage: Stage = "benchmark"
    reason: str = ""
    time_ms: float | None = None
    baseline_ms: float | None = None
    baseline_name: str = ""
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    best_time_ms: float | None = None  # the current best re-timed in the same session, if given
    # head to head with that best, same session: 95% interval of the candidate's worst speedup over the
    # best's (best time / candidate time on one distribution), and whose best it was (decisions.improves_on)
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


class ProfileReport(Strict):
    ok: bool
    summary: str = ""  # a short text the proposer can use
    bound: Literal["memory", "compute", "latency", "unknown"] = "unknown"
    tool: str = ""
    report_key: str | None = None


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
    # the submission's answer brings a new best's profile: taken beside its best-only checks once crowned
    profile_if_crowned: bool = False
    front: bool = False  # the run's oldest unrecorded iteration when started (later: the `front` signal)


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
    profile: ProfileReport | None = None  # a new best's, where the request asked (profile_if_crowned)


class CrownDecision(Strict):
    """The run's answer to a candidacy, taken when it records that iteration: whether it would crown the
    candidate now, and the best as it stands, which the candidate's re-measure meets head to head."""

    crown: bool
    best: BestRef | None = None
