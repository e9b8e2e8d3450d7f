"""The loop's decisions as plain functions: budgets, acceptance, leaderboard, when to compact.
Deterministic and free of I/O, so the workflow can call them and tests need no server."""

from __future__ import annotations

from workflows.contracts import (BenchReport, BestRef, Budget, BudgetChange, Evaluation, IterationRecord,
                                 LeaderEntry, Used)


def limit_reached(budget: Budget, used: Used) -> str | None:
    """The first exhausted budget, as a RunResult.stopped_by value, or None."""
    if budget.iterations is not None and used.iterations >= budget.iterations:
        return "budget-iterations"
    if budget.hours is not None and used.seconds >= budget.hours * 3600:
        return "budget-hours"
    if budget.tokens is not None and used.tokens >= budget.tokens:
        return "budget-tokens"
    if budget.gpu_seconds is not None and used.gpu_seconds >= budget.gpu_seconds:
        return "budget-gpu-seconds"
    return None


#: finished-but-unrecorded evaluations allowed behind the oldest, in populations: a candidacy's best-only
#: checks hold the head of the record order for 30-100 s (more at a shape the worker has not served), while a
#: KDA search on one H200 finishes an evaluation every 3-5 s; at 2 populations its worker ran dry (results.md)
BACKLOG_POPULATIONS = 4


def slots_to_fill(budget: Budget, used: Used, population: int, in_flight: int, running: int) -> int:
    """How many new candidates a rolling step starts: enough to keep `population` evaluations running,
    never past what is left of the iteration budget (counting those already in flight), and at most
    BACKLOG_POPULATIONS x population started-but-unrecorded (a slow oldest evaluation must not grow the
    backlog without bound). A compaction does not cap it: the evaluations under way go on into the next run
    (their results come by signal)."""
    n = population - running
    n = min(n, BACKLOG_POPULATIONS * population - in_flight)
    if budget.iterations is not None:
        n = min(n, budget.iterations - used.iterations - in_flight)
    return max(0, n)


def check_budget_change(budget: Budget, change: BudgetChange, used: Used) -> None:
    """Raise ValueError with a clear message if `change` cannot apply; the update validator calls it,
    so a rejected change is never recorded."""
    if change.iterations is not None and change.iterations < used.iterations:
        raise ValueError(f"iterations {change.iterations} is below the {used.iterations} already run")
    if change.hours is not None and change.hours * 3600 < used.seconds:
        raise ValueError(f"hours {change.hours} is below the {used.seconds / 3600:.3f} h already used")
    if change.tokens is not None and change.tokens < used.tokens:
        raise ValueError(f"tokens {change.tokens} is below the {used.tokens} already used")
    if change.gpu_seconds is not None and change.gpu_seconds < used.gpu_seconds:
        raise ValueError(f"gpu_seconds {change.gpu_seconds} is below the {used.gpu_seconds:.1f} already used")


def apply_budget_change(budget: Budget, change: BudgetChange) -> Budget:
    return budget.model_copy(update=change.model_dump(exclude_unset=True))


def improves_on(result: BenchReport | IterationRecord, best: BestRef | None) -> bool:
    """A new best only when it beats the current best with 95% confidence: a lucky single measurement
    cannot take the crown. The first passing candidate is the first best. Takes a fresh BenchReport, or a
    recorded IterationRecord when acceptance is re-decided in order.

    The evidence is the head-to-head of the same benchmark (the best is timed interleaved with the
    candidate): the interval of the candidate's worst speedup over the best's (best time / candidate
    time on one distribution) lies above 1. Speedups from different
    benchmarks are not compared: a baseline's own time moves between benchmarks of one run by more than
    the differences a search has to resolve, so comparing them crowns slower kernels. Without a head-to-head
    against this very best (a result without vs_best_ci, or one timed against a best since replaced) the
    rule is: the speedup's interval lies above the best's speedup."""
    if not getattr(result, "ok", True) or result.speedup is None:
        return False
    if best is None:
        return True
    if result.vs_best_ci is not None and result.vs_best == best.candidate_id:
        return result.vs_best_ci[0] > 1.0
    low = result.speedup_ci[0] if result.speedup_ci else result.speedup
    return low > best.speedup


def profile_with_verdict(outcome: str, interpreter: bool) -> bool:
    """A submission's verdict brings the kernel's profile only when it crowned a new best: the profile is a
    GPU pass of its own that a loser's answer would wait for, and the model asks for one with `profile`
    whenever it wants it. The interpreter has no profiler."""
    return outcome == "improved" and not interpreter


def update_leaderboard(board: list[LeaderEntry], entry: LeaderEntry, k: int, by_time: bool = False
                       ) -> list[LeaderEntry]:
    """Top-k by speedup (`by_time`: by time, as under the interpreter, whose ratios to the baseline mean
    nothing and are never shown), one entry per candidate (its latest measurement), ties broken by iteration."""
    rest = [e for e in board if e.candidate_id != entry.candidate_id]
    key = (lambda e: (e.time_ms, e.iteration)) if by_time else (lambda e: (-e.speedup, e.iteration))
    return sorted(rest + [entry], key=key)[:k]


def time_to_compact(iterations_this_run: int, compact_every: int, history_suggests: bool) -> bool:
    return iterations_this_run >= compact_every or history_suggests


def default_compact_every(population: int) -> int:
    """Iterations between compactions when the user names none: 10, or 8 x population when larger. A
    search run's compaction does not drain the population (its evaluations go on across continue-as-new),
    but each one still costs a notebook compaction and a new run, and 8 x 24 = 192 iterations are a few
    thousand history events, where Temporal suggests continuing as new anyway."""
    return max(10, 8 * population)


def compaction_problem(policy: str, population: int, compact_every: int) -> str | None:
    """Why a search run's compaction interval cannot work with its population, or None. Below the
    population a run continues as new before it records as many evaluations as it has in flight, so the
    same evaluations are handed on from run to run."""
    if policy == "search" and compact_every < population:
        return (f"compact_every {compact_every} is below population {population}: each run would continue as "
                f"new with more evaluations in flight than it records, carrying the same ones into run after "
                f"run; use at least {population} ({default_compact_every(population)} is the default)")
    return None


def trim(text: str, limit: int = 400) -> str:
    """Reasons stay short in history; the full log lives in the artifact store."""
    text, mark = text.strip(), " ...[trimmed]"
    return text if len(text) <= limit else text[: limit - len(mark)] + mark


def seconds_used(now: float, started_at: float, paused_seconds: float, paused_since: float | None) -> float:
    """The run's time so far less its pauses, the one under way (`paused_since`) included."""
    paused = paused_seconds + (now - paused_since if paused_since is not None else 0.0)
    return now - started_at - paused


def arrived(e: Evaluation) -> bool:
    """Its result or its failure has come back."""
    return e.record is not None or e.failure is not None


def settled(e: Evaluation) -> bool:
    """Nothing more comes from it until the run acts: its result has arrived, or its candidacy waits for an
    answer."""
    return arrived(e) or (e.candidacy is not None and not e.asked)
