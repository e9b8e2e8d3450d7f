"""What a run shows of itself: its search attributes (the Web UI's and `temporal workflow list`'s columns),
its status and its best's summary. Plain functions of the run's state: the workflow publishes them."""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.common import SearchAttributeKey, SearchAttributePair

from workflows.contracts import BestRef, BestSummary, CarriedState, IterationRecord, RunResult, RunSpec, Status
from workflows.text import result_summary

PROBLEM = SearchAttributeKey.for_keyword("MarathonProblem")
ITERATION = SearchAttributeKey.for_int("MarathonIteration")
BEST_SPEEDUP = SearchAttributeKey.for_float("MarathonBestSpeedup")
PHASE = SearchAttributeKey.for_keyword("MarathonPhase")
SEARCH_ATTRIBUTES = [PROBLEM, ITERATION, BEST_SPEEDUP, PHASE]
#: the phases a run's search attribute follows (one event per change); the status query is exact
INDEXED_PHASES = ("paused", "compacting", "done", "reverifying", "proposing")


def search_attributes(spec: RunSpec, st: CarriedState, phase: str) -> list[SearchAttributePair]:
    """Problem, iteration, phase and, off the interpreter (whose ratios mean nothing), the best's speedup."""
    attrs = [PROBLEM.value_set(spec.problem), ITERATION.value_set(st.iteration), PHASE.value_set(phase)]
    if st.best is not None and not st.best.interpreter:
        attrs.append(BEST_SPEEDUP.value_set(st.best.speedup))
    return attrs


def best_summary(best: BestRef | None) -> BestSummary | None:
    if best is None:
        return None
    return BestSummary(candidate_id=best.candidate_id, speedup=None if best.interpreter else best.speedup,
                       time_ms=best.time_ms, baseline_ms=best.baseline_ms, iteration=best.iteration,
                       interpreter=best.interpreter)


def shown(rec: IterationRecord | None) -> IterationRecord | None:
    """A record as the status shows it: an interpreter timing carries no speedup (its ratio means nothing)."""
    return rec.model_copy(update={"speedup": None}) if rec is not None and rec.interpreter else rec


def status(workflow_id: str, spec: RunSpec, st: CarriedState, phase: str, stop) -> Status:
    """The `status` query's answer; `stop` is the run's StopRequest, or None."""
    return Status(workflow_id=workflow_id, problem=spec.problem, policy=spec.policy, iteration=st.iteration,
                  phase=phase, best=best_summary(st.best), budget=spec.budget, used=st.used, runs=st.runs,
                  paused=st.paused, pause_reason=st.pause_reason, stopping=stop is not None, last=shown(st.last),
                  notebook_key=st.notebook_key, notebook_version=st.notebook_version, ledger_key=st.ledger_key,
                  pending_hints=len(st.hints), best_source_key=st.best.source_key if st.best else None,
                  stop_reason=stop.reason if stop else None, refused=st.refused,
                  llm=st.llm_progress if spec.policy == "llm" else None, gpu_queue=spec.gpu_queue)


def result(workflow_id: str, spec: RunSpec, st: CarriedState, stopped_by: str, stop, reverified: bool | None,
           cancelled: Sequence[int] = ()) -> RunResult:
    """The run's result: why it stopped, in the operator's words where a stop or the llm policy gave any."""
    stop_reason = (stop.reason if stop and stopped_by == "stop-signal" else
                   (st.llm_progress.stop_reason or None) if stopped_by in ("exhausted", "turn-budget") else None)
    best = best_summary(st.best)
    return RunResult(summary=result_summary(st.iteration, stopped_by, stop_reason, best, len(cancelled)),
                     workflow_id=workflow_id,
                     problem=spec.problem, iterations=st.iteration, best=best,
                     best_source_key=st.best.source_key if st.best else None, stopped_by=stopped_by, runs=st.runs,
                     used=st.used, notebook_key=st.notebook_key, ledger_key=st.ledger_key, reverified=reverified,
                     stop_reason=stop_reason, cancelled=list(cancelled))
