"""KernelOptimization: the durable loop. propose -> check rules -> compile -> verify -> benchmark ->
record, and every `compact_every` iterations: compact the notebook and continue as new.

Deterministic: it decides and never does I/O. Activities are called by name with their pydantic
contracts, so this module imports nothing heavy (the sandbox re-imports it for every run).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import (
        AGENT_QUEUE, WORKFLOW_TYPE, BenchReport, BenchRequest, BestRef, BestSummary,
        BudgetChange, Budget, CarriedState, CompactRequest, CompactResult, CompileReport, EvalRequest,
        Hint, InFlight, IterationRecord, LeaderEntry, Phase, Proposal, ProposeRequest, RuleReport, RuleRequest,
        RunResult, RunSpec, Status, StopRequest, VerifyReport, explain,
    )
    from pydantic import ValidationError
    from workflows import decisions
    from workflows.llm_loop import llm_step
    from workflows.text import INTERPRETER_NOTE, best_text, budget_text, run_summary, used_text

PROBLEM = SearchAttributeKey.for_keyword("MarathonProblem")
ITERATION = SearchAttributeKey.for_int("MarathonIteration")
BEST_SPEEDUP = SearchAttributeKey.for_float("MarathonBestSpeedup")
PHASE = SearchAttributeKey.for_keyword("MarathonPhase")
SEARCH_ATTRIBUTES = [PROBLEM, ITERATION, BEST_SPEEDUP, PHASE]

# Activity failures that are infrastructure (not the candidate's fault) and survive retries pause the
# run instead of failing it: nothing is lost, and `resume` tries the step again once it is fixed.
_RETRY = RetryPolicy(maximum_attempts=5, initial_interval=timedelta(seconds=1),
                     maximum_interval=timedelta(seconds=30))


class _Rejected(Exception):
    """A candidate fell out of the pipeline; carries its record fields."""

    def __init__(self, stage: str, reason: str, **extra) -> None:
        super().__init__(reason)
        self.stage, self.reason, self.extra = stage, reason, extra


@workflow.defn(name=WORKFLOW_TYPE)
class KernelOptimization:
    # The input arrives as plain JSON and is validated here rather than by the data converter: a typo in
    # `temporal workflow start --input` must fail the run with a message, not fail its first workflow task
    # forever. Typed clients still pass a RunSpec.
    @workflow.init
    def __init__(self, spec: Any) -> None:
        self.invalid: str | None = None
        try:
            parsed = RunSpec.model_validate(spec)
        except ValidationError as e:
            parsed, self.invalid = RunSpec(problem="invalid"), f"invalid run spec: {explain(e)}"
        self.first_run = parsed.carried is None
        self.spec = parsed.model_copy(update={"carried": None})
        self.st: CarriedState = parsed.carried.model_copy(deep=True) if parsed.carried else CarriedState()
        self.pause_free, self.paused_since = False, None  # see run() and _wait_paused
        self.phase: Phase = "starting"
        self.records: list[IterationRecord] = []  # this run's, flushed to the ledger at compaction
        self.stop: StopRequest | None = self.st.stop
        self.st.stop = None
        self.iterations_this_run = 0
        self.finished = False
        self.rolling = False  # set by run(): the rolling population (patch "rolling-population")
        # rolling population: iteration -> (its arguments, task of _evaluate), started but not yet recorded;
        # the arguments are what continue-as-new carries (CarriedState.in_flight)
        self.in_flight: dict[int, tuple[InFlight, asyncio.Task]] = {}
        self.carry = False  # set by run(): evaluations in flight go on into the next run (patch "carry-in-flight")
        self.llm_stopped_by: str | None = None  # llm policy: why its step ended the run, if not "exhausted"

    # ---- the loop ------------------------------------------------------------------------------
    @workflow.run
    async def run(self, spec: Any) -> RunResult:
        if self.invalid:
            raise ApplicationError(self.invalid, type="InvalidRunSpec", non_retryable=True)
        # Decided once, in the run's first activation, where the server's patch notifications are sure to
        # have arrived: a patched() call first made mid-run (inside a later step) could, on a replay, run
        # before its marker was announced, take the old branch and fail as nondeterministic (seen once in
        # CI under load). Histories recorded before it replay the lockstep step.
        self.rolling = workflow.patched("rolling-population")
        # A search run carries its evaluations in flight across continue-as-new and starts them again in the
        # next run, where the GPU worker hands back the work already under way: the GPU pipeline stays full
        # instead of draining and refilling around each compaction.
        self.carry = self.rolling and self.spec.policy == "search" and workflow.patched("carry-in-flight")
        # paused time counts against no budget (histories recorded before counted it)
        self.pause_free = workflow.patched("paused-time-free")
        for f in self.st.in_flight:
            self._launch(f)
        self.st.in_flight = []
        if self.first_run:
            self.st.started_at = workflow.now().timestamp()
            if workflow.patched("check-spec"):  # added after the first recorded histories
                await self._check_spec()
        self._publish()
        stopped_by = None
        while True:
            self._account_time()
            if self.stop:
                stopped_by = "stop-signal"
                await self._drain()
                break
            stopped_by = decisions.limit_reached(self.spec.budget, self.st.used)
            if stopped_by:
                await self._drain()
                break
            if self.st.paused:
                await self._drain()
                self._set_phase("paused")
                await self._wait_paused(lambda: not self.st.paused or self.stop is not None)
                continue
            try:
                exhausted = await self._step()
            except _Paused as p:
                self._pause(p.reason)
                continue
            if exhausted:
                stopped_by = self.llm_stopped_by or "exhausted"
                break
            self._account_time()
            if self.stop or decisions.limit_reached(self.spec.budget, self.st.used):
                continue  # the top of the loop says why; _finish compacts, no needless new run
            if (not self.in_flight or self.carry) and self._time_to_compact():
                await self._compact(final=False)
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._account_time()
                workflow.continue_as_new(self.spec.model_copy(update={"carried": self._carry()}))
        return await self._finish(stopped_by)

    async def _check_spec(self) -> None:
        """Problem and shape must exist (a registry lookup: I/O, so an activity). A bad one fails the run
        with the registry's message instead of pausing it at the first proposal."""
        try:
            await workflow.execute_local_activity(
                "check_spec", self.spec, start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=3))
        except ActivityError as e:
            cause = e.cause
            if isinstance(cause, ApplicationError) and cause.type == "InvalidRunSpec":
                raise ApplicationError(cause.message, type="InvalidRunSpec", non_retryable=True) from None
            raise

    async def _step(self) -> bool:
        """One step: `population` candidates evaluated in parallel, each its own iteration number.
        Returns True when the proposer has nothing new left to try."""
        if self.spec.policy == "llm":
            return await llm_step(self)
        if self.rolling:
            return await self._rolling_step()
        n = decisions.iterations_this_step(self.spec.budget, self.st.used, self.spec.population)
        first = self.st.iteration + 1
        hints, self.st.hints = self.st.hints, []
        try:
            proposals = await self._propose(first, n, hints)
        except _Paused:
            self.st.hints = hints + self.st.hints  # not shown to anyone yet
            raise
        if all(p.candidate is None for p in proposals):
            return True
        self._set_phase("checking")
        best_before = self.st.best
        outcomes = await asyncio.gather(*(self._evaluate(first + i, i, p, best_before)
                                          for i, p in enumerate(proposals)), return_exceptions=True)
        # An infrastructure failure in any slot pauses the step as a whole once every slot has
        # settled: nothing is recorded, and the same iteration numbers are tried again on resume.
        for o in outcomes:
            if isinstance(o, BaseException):
                raise o
        # Record in iteration order so numbering and acceptance are the same on every replay.
        self._set_phase("recording")
        for rec in outcomes:
            await self._record(rec)
        return False

    async def _rolling_step(self) -> bool:
        """Rolling population: keep `population` evaluations running, so candidates compile on the GPU
        worker's CPU cores while earlier ones hold the GPU (a lockstep step left the GPU idle while its
        slowest compile finished). Results are recorded strictly in iteration order as they complete.
        Returns True when the proposer has nothing new left and nothing is in flight."""
        for it, (_, task) in self.in_flight.items():
            if task.done() and task.exception() is not None:
                reason = await self._drain()
                raise _Paused(reason or f"evaluation #{it} failed")
        await self._record_finished()
        if self.carry and self._time_to_compact():
            return False  # run() compacts and continues as new now, carrying what is in flight
        n = decisions.slots_to_fill(
            self.spec.budget, self.st.used, self.spec.population, len(self.in_flight),
            sum(not t.done() for _, t in self.in_flight.values()), self.iterations_this_run,
            self.spec.compact_every, workflow.info().is_continue_as_new_suggested(), carry=self.carry)
        exhausted = False
        for _ in range(n):
            it = self.st.iteration + len(self.in_flight) + 1
            hints, self.st.hints = self.st.hints, []
            try:
                prop = (await self._propose(it, 1, hints, taken=[f.proposal.candidate.candidate_id
                                                                  for f, _ in self.in_flight.values()]))[0]
            except _Paused:
                self.st.hints = hints + self.st.hints  # not shown to anyone yet
                raise
            if prop.candidate is None:
                exhausted = True
                break
            self._set_phase("checking")
            self._launch(InFlight(iteration=it, slot=(it - 1) % self.spec.population, proposal=prop,
                                  best=self.st.best, started_at=workflow.now().timestamp()))
        if not self.in_flight:
            return exhausted
        # Wait for a change: one of the evaluations running now finishes. (Waiting for "any done" would
        # return at once while a finished one waits behind a slower, older one.)
        running = [t for _, t in self.in_flight.values() if not t.done()]
        if running:
            await workflow.wait_condition(lambda: any(t.done() for t in running))
        return False

    def _launch(self, f: InFlight) -> None:
        """Start one evaluation of the rolling population (or, at a run's start, one carried from the last)."""
        task = asyncio.get_running_loop().create_task(
            self._evaluate(f.iteration, f.slot, f.proposal, f.best, f.started_at))
        self.in_flight[f.iteration] = (f, task)

    def _time_to_compact(self) -> bool:
        return decisions.time_to_compact(self.iterations_this_run, self.spec.compact_every,
                                         workflow.info().is_continue_as_new_suggested())

    async def _record_finished(self) -> None:
        """Record the finished evaluations at the front of the queue, in iteration order."""
        while self.st.iteration + 1 in self.in_flight:
            _, task = self.in_flight[self.st.iteration + 1]
            if not task.done() or task.exception() is not None:
                return
            del self.in_flight[self.st.iteration + 1]
            self._set_phase("recording")
            await self._record(task.result())

    async def _drain(self) -> str | None:
        """Let every evaluation in flight settle; record them in order up to the first that failed for
        infrastructure reasons, discard that one and everything after it (their iteration numbers are
        tried again later, so nothing is recorded twice and no number is skipped). Returns the failure."""
        if not self.in_flight:
            return None
        await workflow.wait_condition(lambda: all(t.done() for _, t in self.in_flight.values()))
        await self._record_finished()
        failure = None
        if self.in_flight:
            first = self.in_flight[min(self.in_flight)][1].exception()
            failure = first.reason if isinstance(first, _Paused) else str(first)
            for _, t in self.in_flight.values():
                exc = t.exception()
                if exc is not None and not isinstance(exc, _Paused):
                    raise exc  # a bug, not infrastructure: fail the workflow task, as the lockstep path does
            self.in_flight = {}
        return failure

    async def _propose(self, first: int, n: int, hints: list[str], taken: list[str] | None = None
                       ) -> list[Proposal]:
        self._set_phase("proposing")
        out: list[Proposal] = []
        for slot in range(n):  # sequential: sibling slots must not propose the same candidate
            req = ProposeRequest(
                problem=self.spec.problem, policy=self.spec.policy, seed=self.spec.seed,
                iteration=first + slot, slot=slot, shape=self.spec.shape,
                leaderboard=self.st.leaderboard, recent=self.records[-50:], ledger_key=self.st.ledger_key,
                notebook_key=self.st.notebook_key, hints=hints,
                taken=(taken or []) + [p.candidate.candidate_id for p in out if p.candidate])
            out.append(await self._local("propose_candidate", req, Proposal))
        return out

    async def _evaluate(self, iteration: int, slot: int, prop: Proposal, best: BestRef | None,
                        started_at: float | None = None) -> IterationRecord:
        started = started_at or workflow.now().timestamp()  # a carried evaluation keeps its first start
        cand = prop.candidate
        if cand is None:
            return IterationRecord(iteration=iteration, slot=slot, candidate_id="-", source_key="-",
                                   outcome="rejected", stage="propose", reason=prop.note or "no proposal",
                                   started_at=started, finished_at=started)
        base = dict(iteration=iteration, slot=slot, candidate_id=cand.candidate_id,
                    source_key=cand.source_key, knobs=cand.knobs, rationale=cand.rationale,
                    started_at=started)
        ev = EvalRequest(problem=self.spec.problem, candidate_id=cand.candidate_id,
                         source_key=cand.source_key, shape=self.spec.shape, iteration=iteration)
        try:
            rules = await self._local("check_rules", RuleRequest(problem=self.spec.problem,
                                                                  source_key=cand.source_key), RuleReport)
            if not rules.ok:
                raise _Rejected("rules", f"{rules.rule}: {rules.detail}")
            self._set_phase("compiling")
            comp = await self._gpu("compile_candidate", ev, CompileReport, minutes=15)
            if not comp.ok:
                raise _Rejected("compile", comp.error, log_key=comp.log_key, interpreter=comp.interpreter)
            self._set_phase("verifying")
            ver = await self._gpu("verify_candidate", ev, VerifyReport, minutes=20)
            if not ver.ok:
                raise _Rejected(ver.stage, ver.reason, rel_err=ver.rel_err, log_key=ver.log_key,
                                interpreter=ver.interpreter)
            self._set_phase("benchmarking")
            bench = await self._gpu("benchmark_candidate", BenchRequest(**ev.model_dump(), best=best),
                                    BenchReport, minutes=20)
            gpu_s = bench.gpu_seconds
            self.st.device_facts = bench.device_facts or self.st.device_facts
            if not bench.ok:
                raise _Rejected(bench.stage, bench.reason, log_key=bench.log_key,
                                interpreter=bench.interpreter, gpu_seconds=gpu_s)
            outcome = "passed"
            if decisions.improves_on(bench, best) and best is not None and not bench.interpreter:
                # A new best is re-measured in a fresh process before it is believed.
                again = await self._gpu("benchmark_candidate",
                                        BenchRequest(**ev.model_dump(), best=best, fresh_process=True),
                                        BenchReport, minutes=20)
                gpu_s += again.gpu_seconds
                if again.ok and decisions.improves_on(again, best):
                    bench = again
                    outcome = "improved"
            elif decisions.improves_on(bench, best):
                outcome = "improved"
            return IterationRecord(**base, outcome=outcome, time_ms=bench.time_ms,
                                   baseline_ms=bench.baseline_ms, speedup=bench.speedup,
                                   speedup_ci=bench.speedup_ci, vs_best_ci=bench.vs_best_ci,
                                   vs_best=bench.vs_best, rel_err=ver.rel_err,
                                   interpreter=bench.interpreter, gpu_seconds=gpu_s,
                                   log_key=bench.log_key, deciding_dist=bench.deciding_dist,
                                   host_ms=bench.host_ms, baseline_host_ms=bench.baseline_host_ms,
                                   finished_at=workflow.now().timestamp())
        except _Rejected as r:
            return IterationRecord(**base, outcome="rejected", stage=r.stage,
                                   reason=decisions.trim(r.reason), finished_at=workflow.now().timestamp(),
                                   **r.extra)

    async def _record(self, rec: IterationRecord) -> None:
        # Acceptance is decided here, in iteration order, against the best as it stands now: two
        # parallel slots that both beat the old best cannot both be crowned.
        if rec.outcome == "improved" and not decisions.improves_on(rec, self.st.best):
            rec = rec.model_copy(update={"outcome": "passed"})
        if rec.outcome == "improved":
            self.st.best = BestRef(candidate_id=rec.candidate_id, source_key=rec.source_key,
                                   speedup=rec.speedup, time_ms=rec.time_ms, baseline_ms=rec.baseline_ms,
                                   iteration=rec.iteration, interpreter=rec.interpreter, knobs=rec.knobs)
        if rec.outcome in ("improved", "passed") and rec.speedup is not None:
            self.st.leaderboard = decisions.update_leaderboard(
                self.st.leaderboard,
                LeaderEntry(candidate_id=rec.candidate_id, source_key=rec.source_key, speedup=rec.speedup,
                            time_ms=rec.time_ms, iteration=rec.iteration, knobs=rec.knobs),
                self.spec.top_k)
        assert rec.iteration == self.st.iteration + 1, "iterations are recorded contiguously"
        self.st.iteration = rec.iteration
        self.st.used.iterations += 1
        self.st.used.gpu_seconds += rec.gpu_seconds
        self.st.last = rec
        self.records.append(rec)
        self.iterations_this_run += 1
        self._account_time()
        self._publish()

    # ---- compaction and the end ----------------------------------------------------------------
    async def _compact(self, final: bool) -> None:
        self._set_phase("compacting")
        req = CompactRequest(workflow_id=workflow.info().workflow_id, problem=self.spec.problem,
                             policy=self.spec.policy, model=self.spec.model, run=self.st.runs,
                             records=self.records, notebook_key=self.st.notebook_key,
                             notebook_version=self.st.notebook_version, ledger_key=self.st.ledger_key,
                             best=self.st.best, final=final, adapted=self.st.llm_adapted,
                             hints=self.st.llm_hints, conversation_key=self.st.conversation_key,
                             tool_results=self.st.pending_tool_results)
        while True:
            try:
                res = await self._agent("compact_notebook", req, CompactResult, minutes=10)
                break
            except _Paused as p:
                # Compaction must happen before continue-as-new; wait for the operator to fix it.
                self._pause(p.reason)
                self._set_phase("paused")
                await self._wait_paused(lambda: not self.st.paused)
                self._set_phase("compacting")
        self.st.notebook_key, self.st.notebook_version = res.notebook_key, res.notebook_version
        self.st.ledger_key = res.ledger_key
        self.st.used.tokens_in += res.tokens_in
        self.st.used.tokens_out += res.tokens_out
        self.records = []

    async def _finish(self, stopped_by: str) -> RunResult:
        reverified = None
        if self.st.best is not None and stopped_by == "stop-signal":
            self._set_phase("reverifying")
            reverified = await self._reverify_best()
        if self.records or self.st.ledger_key is None:
            await self._compact(final=True)
        self._account_time()
        self.finished = True
        self._set_phase("done")
        await workflow.wait_condition(workflow.all_handlers_finished)
        return RunResult(workflow_id=workflow.info().workflow_id, problem=self.spec.problem,
                         iterations=self.st.iteration, best=self._best_summary(),
                         best_source_key=self.st.best.source_key if self.st.best else None,
                         stopped_by=stopped_by, runs=self.st.runs, used=self.st.used,
                         notebook_key=self.st.notebook_key, ledger_key=self.st.ledger_key,
                         reverified=reverified,
                         stop_reason=self.stop.reason if self.stop and stopped_by == "stop-signal" else None)

    async def _reverify_best(self) -> bool:
        b = self.st.best
        ev = EvalRequest(problem=self.spec.problem, candidate_id=b.candidate_id, source_key=b.source_key,
                         shape=self.spec.shape)
        try:
            ver = await self._gpu("verify_candidate", ev, VerifyReport, minutes=20)
            return ver.ok
        except _Paused:
            return False

    def _carry(self) -> CarriedState:
        st = self.st.model_copy(deep=True)
        st.runs += 1
        st.in_flight = [f for _, (f, _) in sorted(self.in_flight.items())]  # empty unless self.carry
        st.stop = self.stop  # set when the signal came during the compaction before continue-as-new
        return st

    # ---- activity calls ------------------------------------------------------------------------
    async def _agent(self, name: str, arg, result_type, minutes: int = 2):
        return await self._call(name, arg, result_type, AGENT_QUEUE, minutes)

    async def _local(self, name: str, arg, result_type):
        """Short CPU-only agent steps (the search proposer, the static rule check) run as local
        activities: recorded in history like any activity, without two trips through the server's
        task queues (tens of milliseconds each on the dev server; docs/results.md)."""
        try:
            return await workflow.execute_local_activity(
                name, arg, result_type=result_type, start_to_close_timeout=timedelta(seconds=60),
                retry_policy=_RETRY, summary=f"{name} #{self.st.iteration + 1}")
        except ActivityError as e:
            msg = str(e.cause) if e.cause is not None else str(e)
            raise _Paused(f"{name} failed: {decisions.trim(msg, 300)}") from e
        except ApplicationError as e:
            # A local activity's failure can also arrive as its cause alone, without the ActivityError around
            # it: seen after a workflow task timed out and the task was retried (the store-breaks test, with a
            # rolling population of 3). Escaping here it failed the whole run instead of pausing it.
            raise _Paused(f"{name} failed: {decisions.trim(str(e), 300)}") from e

    async def _gpu(self, name: str, arg, result_type, minutes: int):
        return await self._call(name, arg, result_type, self.spec.gpu_queue, minutes)

    async def _call(self, name: str, arg, result_type, queue: str, minutes: int):
        try:
            return await workflow.execute_activity(
                name, arg, result_type=result_type, task_queue=queue,
                start_to_close_timeout=timedelta(minutes=minutes),
                heartbeat_timeout=timedelta(seconds=self.spec.heartbeat_seconds),
                retry_policy=_RETRY, summary=f"{name} #{self.st.iteration + 1}")
        except ActivityError as e:
            cause = e.cause
            msg = str(cause) if cause is not None else str(e)
            raise _Paused(f"{name} failed: {decisions.trim(msg, 300)}") from e

    # ---- operator controls ---------------------------------------------------------------------
    # The update takes a plain mapping and validates it itself: a typed argument that fails to decode
    # would reach the caller as "Failed decoding arguments" instead of saying which field is wrong.
    @workflow.update
    def set_budget(self, change: dict) -> Budget:
        new = decisions.apply_budget_change(self.spec.budget, BudgetChange.model_validate(change))
        self.spec = self.spec.model_copy(update={"budget": new})
        self._publish()
        return self.spec.budget

    @set_budget.validator
    def _check_budget(self, change: dict) -> None:
        if self.finished:
            raise ValueError("the run has finished")
        try:
            parsed = BudgetChange.model_validate(change)
        except ValidationError as e:
            raise ValueError(f"invalid budget change: {explain(e)}") from None
        decisions.check_budget_change(self.spec.budget, parsed, self.st.used)

    # llm policy: the prompt's size cap, changed on a running run (an endpoint with a smaller context)
    @workflow.update
    def set_context_tokens(self, tokens: int) -> int:
        self.spec = self.spec.model_copy(update={"context_tokens": tokens})
        return tokens

    @set_context_tokens.validator
    def _check_context_tokens(self, tokens: int) -> None:
        if self.finished:
            raise ValueError("the run has finished")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 2000:
            raise ValueError(f"context_tokens must be a whole number of at least 2000, got {tokens!r}")

    @workflow.signal
    def stop(self, req: StopRequest) -> None:
        self.stop = req
        workflow.set_current_details(self._details())

    @workflow.signal
    def pause(self) -> None:
        self._pause("paused by operator")

    @workflow.signal
    def resume(self) -> None:
        self.st.paused, self.st.pause_reason = False, ""

    @workflow.signal
    def clear_hints(self) -> None:
        """llm policy: the hints in force (shown every turn, kept in the notebook) are dropped."""
        self.st.llm_hints = []

    @workflow.signal
    def hint(self, h: Hint) -> None:
        self.st.hints.append(h.text)

    @workflow.query
    def status(self) -> Status:
        return Status(workflow_id=workflow.info().workflow_id, problem=self.spec.problem,
                      policy=self.spec.policy, iteration=self.st.iteration, phase=self.phase,
                      best=self._best_summary(), budget=self.spec.budget, used=self.st.used,
                      runs=self.st.runs, paused=self.st.paused, pause_reason=self.st.pause_reason,
                      stopping=self.stop is not None, last=self.st.last, notebook_key=self.st.notebook_key,
                      notebook_version=self.st.notebook_version, ledger_key=self.st.ledger_key,
                      pending_hints=len(self.st.hints),
                      best_source_key=self.st.best.source_key if self.st.best else None,
                      stop_reason=self.stop.reason if self.stop else None)

    @workflow.query
    def leaderboard(self) -> list[LeaderEntry]:
        return self.st.leaderboard

    # ---- bookkeeping ---------------------------------------------------------------------------
    def _pause(self, reason: str) -> None:
        # Takes effect at the loop's next quiet point, which sets the phase to "paused".
        self.st.paused, self.st.pause_reason = True, reason

    async def _wait_paused(self, resumed) -> None:
        self.paused_since = workflow.now().timestamp()
        try:
            await workflow.wait_condition(resumed)
        finally:
            if self.pause_free:
                self.st.used.paused_seconds += workflow.now().timestamp() - self.paused_since
            self.paused_since = None

    def _account_time(self) -> None:
        now = workflow.now().timestamp()
        paused = self.st.used.paused_seconds
        if self.pause_free and self.paused_since is not None:  # a status read while paused
            paused += now - self.paused_since
        self.st.used.seconds = now - self.st.started_at - paused

    def _best_summary(self) -> BestSummary | None:
        b = self.st.best
        if b is None:
            return None
        return BestSummary(candidate_id=b.candidate_id, speedup=b.speedup, time_ms=b.time_ms,
                           baseline_ms=b.baseline_ms, iteration=b.iteration, interpreter=b.interpreter)

    def _set_phase(self, phase: Phase) -> None:
        # The search attribute follows the coarse phase (one event per change); `status` is exact.
        self.phase = phase
        if phase in ("paused", "compacting", "done", "reverifying", "proposing"):
            workflow.upsert_search_attributes([PHASE.value_set(phase)])
        workflow.set_current_details(self._details())  # not a command: history is unchanged

    def _publish(self) -> None:
        """Web UI: search attributes and the live leaderboard as current details."""
        attrs = [PROBLEM.value_set(self.spec.problem), ITERATION.value_set(self.st.iteration),
                 PHASE.value_set(self.phase)]
        if self.st.best is not None and not self.st.best.interpreter:  # interpreter ratios mean nothing
            attrs.append(BEST_SPEEDUP.value_set(self.st.best.speedup))
        workflow.upsert_search_attributes(attrs)
        workflow.set_current_details(self._details())

    def _details(self) -> str:
        """Markdown for the Web UI's current details, set again in every run (continue-as-new carries no
        start summary, so the summary heads the details): the state, then the crowned best and the
        leaderboard as one table."""
        b, last = self.st.best, self.st.last
        interp = (b is not None and b.interpreter) or (last is not None and last.interpreter)
        lines = [f"**{run_summary(self.spec)}**", "",
                 f"- iteration {self.st.iteration}, run {self.st.runs}, phase {self.phase}",
                 f"- budget: {budget_text(self.spec.budget)}",
                 f"- used: {used_text(self.st.used, self.spec.policy == 'llm')}",
                 f"- best: {best_text(b)}"]
        if self.st.paused:
            lines.append(f"- paused: {self.st.pause_reason}")
        if self.stop is not None:
            lines.append(f"- stopping: {self.stop.reason}")
        if last is not None:
            lines.append(f"- last: #{last.iteration} {last.outcome}"
                         + (f" at {last.stage}: {last.reason.splitlines()[0][:120] if last.reason else ''}"
                            if last.outcome == "rejected" else ""))
        if interp:
            lines += ["", f"_{INTERPRETER_NOTE}._"]
        rows = ([(b.candidate_id, b.speedup, b.time_ms, b.iteration, "crowned best")] if b else []) + [
            (e.candidate_id, e.speedup, e.time_ms, e.iteration, "") for e in self.st.leaderboard
            if b is None or e.candidate_id != b.candidate_id]
        if rows:
            lines += ["", "| # | candidate | " + ("interpreter ms" if interp else "speedup | ms")
                      + " | iteration | |", "|---|---|---|---|---|" + ("" if interp else "---|")]
            for i, (cid, speedup, ms, it, note) in enumerate(rows, 1):
                figures = f"{ms:.4g}" if interp else f"{speedup:.3g}x | {ms:.4g}"
                lines.append(f"| {i} | `{cid}` | {figures} | {it} | {note} |")
        return "\n".join(lines)[:19000]


class _Paused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
