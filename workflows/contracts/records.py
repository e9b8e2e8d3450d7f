"""What a run keeps of its candidates: the record of each evaluated one (the ledger's entries), the crowned
best and the leaderboard."""

from __future__ import annotations

from workflows.contracts.base import Outcome, Stage, Strict, Verdict


class BestRef(Strict):
    candidate_id: str
    source_key: str
    speedup: float
    time_ms: float
    baseline_ms: float
    iteration: int
    interpreter: bool = False
    knobs: dict | None = None
    deciding_dist: str | None = None  # where its worst speedup was measured: a challenger is timed there first


class LeaderEntry(Strict):
    candidate_id: str
    source_key: str
    speedup: float
    time_ms: float
    iteration: int
    knobs: dict | None = None


class IterationRecord(Verdict):
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
    # when its own stages had answered (its benchmark, or a rejection before it): a would-be best then waits for
    # the run's answer to its candidacy and, crowned, for its checks; finished_at - judged_at is that time
    judged_at: float = 0.0
    family: str | None = None  # the cheating family a rejection names (FAMILIES), from its reason

    def refused(self) -> bool:
        return self.outcome == "rejected"


class BestSummary(Strict):
    candidate_id: str
    speedup: float | None  # None under the interpreter: its ratios to the baseline mean nothing
    time_ms: float
    baseline_ms: float
    iteration: int
    interpreter: bool = False
