"""KernelOptimization: the durable loop. propose -> evaluate (a child workflow per candidate: rules, compile,
verify, benchmark) -> record, and every `compact_every` iterations: compact the notebook and continue as new.

Deterministic: it decides and never does I/O. Activities are called by name with their pydantic
contracts, so this module imports nothing heavy (the sandbox re-imports it for every run).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from workflows import controls, decisions, run_end, run_view
    from workflows.contracts import (
        AGENT_QUEUE, WORKFLOW_TYPE, BestRef, Budget, Candidate, CarriedState, CrownDecision, EvaluateRequest,
        Evaluation, EvaluationResult, IterationRecord, LeaderEntry, Phase, ProfileReport, Proposal, ProposeRequest,
        RunResult, RunSpec, Status, StopRequest, explain,
    )
    from workflows.evaluation import (CROWN_SIGNAL, EVALUATE_TYPE, FRONT, FRONT_SIGNAL, RESULT_SIGNAL, Interrupted,
                                      Paused, call_activity, call_local)
    from workflows.llm_loop import AT_START_PATCH as LLM_AT_START_PATCH, llm_step
    from workflows.text import evaluation_summary, run_details, run_summary

# a GPU activity of the run itself (an llm tool, the best's re-verification) gives way to a stop with `now`
STOP_NOW_PATCH = "stop-now-cancels-gpu-waits"
# the oldest unrecorded iteration's evaluation is told so (`front`): its stages go first in their queues
FRONT_PATCH = "front-iteration-first"


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
        self.paused_since: float | None = None  # see wait_paused
        self.phase: Phase = "starting"
        self.records: list[IterationRecord] = []  # this run's, flushed to the ledger at compaction
        self.stop: StopRequest | None = self.st.stop
        self.st.stop = None
        self.iterations_this_run = 0
        self.finished = False
        # evaluations started and not yet recorded, by iteration (carried across continue-as-new): their
        # child workflows signal the results (`evaluated`), recorded strictly in iteration order
        self.evaluations: dict[int, Evaluation] = {e.iteration: e for e in self.st.evaluations}
        self.st.evaluations = []
        self.last_profile: ProfileReport | None = None  # the profile that came with the last record, if any
        self.starting: list[asyncio.Task] = []  # child workflow starts not yet confirmed by the server
        self.llm_stopped_by: str | None = None  # llm policy: why its step ended the run, if not "exhausted"
        self.llm_patches_at_start = False  # llm policy: its patches decided in this run's first activation
        self.gpu_interruptible = self.front_first = False  # STOP_NOW_PATCH, FRONT_PATCH: in the first activation
        self.cancelled: list[int] = []  # iterations whose evaluations a stop with `now` cancelled

    # ---- the loop ------------------------------------------------------------------------------
    @workflow.run
    async def run(self, spec: Any) -> RunResult:
        if self.invalid:
            raise ApplicationError(self.invalid, type="InvalidRunSpec", non_retryable=True)
        if self.spec.policy == "llm":  # decided before the first local activity, as the summary's patch below
            self.llm_patches_at_start = workflow.patched(LLM_AT_START_PATCH)
        self.gpu_interruptible = workflow.patched(STOP_NOW_PATCH)
        self.front_first = workflow.patched(FRONT_PATCH)
        if self.first_run:
            # a run started without `marathon start` (the plain temporal CLI) gets the same summary in its memo: set
            # whatever the start's memo holds (a replay may see the memo as it is now), and before the first local
            # activity (a patch marker after one is met on replay before the code that follows it has run)
            if workflow.patched("summary-in-memo"):
                workflow.upsert_memo({"summary": run_summary(self.spec)})
            self.st.started_at = workflow.now().timestamp()
            await self._check_spec()
        self.publish()
        stopped_by = None
        while True:
            self.account_time()
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
                self.set_phase("paused")
                await self.wait_paused(lambda: not self.st.paused or self.stop is not None)
                continue
            try:
                exhausted = await self._step()
            except Interrupted:
                continue  # the stop is under way: the loop's top ends the run
            except Paused as p:
                self.pause_for(p.reason)
                continue
            if exhausted:
                stopped_by = self.llm_stopped_by or "exhausted"
                break
            self.account_time()
            if self.stop or decisions.limit_reached(self.spec.budget, self.st.used):
                continue  # the top of the loop says why; run_end.finish compacts, no needless new run
            if self._time_to_compact():
                # the evaluations under way go on meanwhile: their results reach the next run
                await run_end.compact(self, final=False)
                await workflow.wait_condition(lambda: self._started() and workflow.all_handlers_finished())
                self.account_time()
                workflow.continue_as_new(self.spec.model_copy(update={"carried": self._carry()}))
        return await run_end.finish(self, stopped_by)

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
        """One step of the policy. Returns True when the proposer has nothing new left to try."""
        if self.spec.policy == "llm":
            return await llm_step(self)
        return await self._rolling_step()

    async def _rolling_step(self) -> bool:
        """Rolling population: keep `population` evaluations running, so candidates compile on the GPU
        worker's CPU cores while earlier ones hold the GPU. Results are recorded strictly in iteration order
        as they arrive. Returns True when the proposer has nothing new left and nothing is in flight."""
        if any(e.failure for e in self.evaluations.values()):
            reason = await self._drain()
            if self.stopping_now():
                return False  # the loop's top ends the run
            raise Paused(reason or "an evaluation failed")
        await self._record_finished()
        if self._time_to_compact():
            return False  # run() compacts and continues as new now; the evaluations under way go on
        n = decisions.slots_to_fill(self.spec.budget, self.st.used, self.spec.population, len(self.evaluations),
                                    sum(not decisions.settled(e) for e in self.evaluations.values()))
        exhausted = False
        for _ in range(n):
            it = self.st.iteration + len(self.evaluations) + 1
            hints, self.st.hints = self.st.hints, []
            try:
                prop = (await self._propose(it, 1, hints,
                                            taken=[e.candidate_id for e in self.evaluations.values()]))[0]
            except Paused:
                self.st.hints = hints + self.st.hints  # not shown to anyone yet
                raise
            if prop.candidate is None:
                exhausted = True
                break
            self.set_phase("evaluating")
            self._launch(it, (it - 1) % self.spec.population, prop.candidate)
        if not self.evaluations:
            return exhausted
        # Wait for a change: one of the evaluations running now delivers its result or its candidacy. (Waiting
        # for "any arrived" would return at once while an arrived one waits behind a slower, older one.)
        running = [e for e in self.evaluations.values() if not decisions.settled(e)]
        if running:
            await workflow.wait_condition(lambda: any(decisions.settled(e) for e in running) or self.stopping_now())
        return False

    def _launch(self, iteration: int, slot: int, cand: Candidate, profile_if_crowned: bool = False) -> None:
        """Start one evaluation as a child workflow that outlives this run (ParentClosePolicy.ABANDON)
        and signals its result to the run's workflow id."""
        child = f"{workflow.info().workflow_id}-eval-{iteration}-{str(workflow.uuid4())[:8]}"
        front = self.front_first and iteration == self.st.iteration + 1
        self.evaluations[iteration] = Evaluation(iteration=iteration, slot=slot, candidate_id=cand.candidate_id,
                                                 workflow_id=child, front=front)
        req = EvaluateRequest(problem=self.spec.problem, iteration=iteration, slot=slot, candidate=cand,
                              best=self.st.best, shape=self.spec.shape, gpu_queue=self.spec.gpu_queue,
                              heartbeat_seconds=self.spec.heartbeat_seconds,
                              started_at=workflow.now().timestamp(), profile_if_crowned=profile_if_crowned,
                              front=front)
        self.starting = [t for t in self.starting if not t.done()]
        summary = evaluation_summary(iteration, cand.candidate_id, self.spec.budget, self.st)
        self.starting.append(asyncio.get_running_loop().create_task(self._start_child(child, req, summary)))

    async def _start_child(self, child: str, req: EvaluateRequest, summary: str) -> None:
        # the summary is user metadata, not compared on replay: histories that recorded a shorter one replay
        try:
            await workflow.start_child_workflow(
                EVALUATE_TYPE, req, id=child, parent_close_policy=ParentClosePolicy.ABANDON, static_summary=summary)
        except Exception as e:  # noqa: BLE001 - e.g. the id is taken: the run pauses with the reason
            self.evaluated(EvaluationResult(iteration=req.iteration, workflow_id=child,
                                            failure=f"evaluation #{req.iteration} did not start: "
                                                    f"{decisions.trim(str(e), 300)}"))

    def _started(self) -> bool:
        return all(t.done() for t in self.starting)

    @workflow.signal(name=RESULT_SIGNAL)
    def evaluated(self, res: EvaluationResult) -> None:
        """An evaluation's child workflow delivers its result, or its candidacy as a new best (to whichever
        run of this workflow is current)."""
        e = self.evaluations.get(res.iteration)
        if e is None or e.workflow_id != res.workflow_id or decisions.arrived(e):
            return  # another attempt at this iteration, or delivered twice
        if res.candidacy:
            e.candidacy = e.candidacy or res.record
            return
        e.record, e.failure, e.profile = res.record, res.failure, res.profile
        self.st.device_facts = res.device_facts or self.st.device_facts

    def _time_to_compact(self) -> bool:
        return decisions.time_to_compact(self.iterations_this_run, self.spec.compact_every,
                                         workflow.info().is_continue_as_new_suggested())

    async def _record_finished(self) -> None:
        """Record the arrived results at the front of the queue, in iteration order; a candidacy at the front
        is answered, against the best as it stands now, and its result recorded when it comes."""
        while (e := self.evaluations.get(self.st.iteration + 1)) is not None:
            if e.record is None:
                if e.candidacy is not None and not e.asked and e.failure is None:
                    await self._answer(e, decisions.improves_on(e.candidacy, self.st.best))
                elif self.front_first and not e.front and e.candidacy is None and e.failure is None:
                    await self._tell_front(e)
                return
            del self.evaluations[e.iteration]
            self.set_phase("recording")
            self.last_profile = e.profile
            await self._record(e.record)

    async def _answer(self, e: Evaluation, crown: bool) -> None:
        """A candidacy's answer (CrownDecision) to its child workflow; the child gone is the evaluation's
        failure."""
        e.asked = True
        try:
            await workflow.get_external_workflow_handle(e.workflow_id).signal(
                CROWN_SIGNAL, CrownDecision(crown=crown, best=self.st.best))
        except Exception as ex:  # noqa: BLE001 - e.g. the child was terminated: the run pauses with the reason
            e.failure = f"evaluation #{e.iteration} took no answer: {decisions.trim(str(ex), 300)}"

    async def _tell_front(self, e: Evaluation) -> None:
        """The front of the order is told so: the stages it schedules now go before those of later ones."""
        e.front = True
        await workflow.wait_condition(self._started)  # its child may still be starting (the server's answer)
        with contextlib.suppress(Exception):  # it has ended: its result is on its way
            await workflow.get_external_workflow_handle(e.workflow_id).signal(FRONT_SIGNAL)

    async def _drain(self) -> str | None:
        """Wait for every evaluation under way; record them in order up to the first that failed for
        infrastructure reasons, discard that one and everything after it (their iteration numbers are
        tried again later, so nothing is recorded twice and no number is skipped). Returns the failure."""
        while self.evaluations:
            await workflow.wait_condition(lambda: all(decisions.settled(e) for e in self.evaluations.values())
                                          or self.stopping_now())
            if self.stopping_now():
                await self._record_finished()
                await self._cancel_under_way()
                return None
            await self._record_finished()
            if not self.evaluations or not all(decisions.settled(e) for e in self.evaluations.values()):
                continue  # a candidacy at the front was answered: its result comes next
            failure = self.evaluations[min(self.evaluations)].failure or "an evaluation failed"
            for e in self.evaluations.values():  # discarded: candidacies waiting behind it are let go unchecked
                if e.candidacy is not None and not e.asked and e.failure is None:
                    await self._answer(e, False)
            self.evaluations = {}
            return failure
        return None

    def stopping_now(self) -> bool:
        return self.stop is not None and self.stop.now

    async def _cancel_under_way(self) -> None:
        """A stop with `now`: the evaluations not yet recorded are cancelled (their GPU stages with them) and
        their iterations left unrecorded; a child workflow that has ended meanwhile is let be."""
        await workflow.wait_condition(self._started)  # the server's confirmation; no worker needed
        for it, e in sorted(self.evaluations.items()):
            try:
                await workflow.get_external_workflow_handle(e.workflow_id).cancel()
            except Exception:  # noqa: BLE001 - it ended, or never started: nothing left to cancel
                pass
            self.cancelled.append(it)
        self.evaluations = {}

    async def _propose(self, first: int, n: int, hints: list[str], taken: list[str] | None = None
                       ) -> list[Proposal]:
        self.set_phase("proposing")
        out: list[Proposal] = []
        for slot in range(n):  # sequential: sibling slots must not propose the same candidate
            req = ProposeRequest(
                problem=self.spec.problem, policy=self.spec.policy, seed=self.spec.seed,
                iteration=first + slot, slot=slot, shape=self.spec.shape,
                leaderboard=self.st.leaderboard, recent=self.records[-50:], ledger_key=self.st.ledger_key,
                notebook_key=self.st.notebook_key, hints=hints,
                taken=(taken or []) + [p.candidate.candidate_id for p in out if p.candidate],
                start_kernel=self.spec.start_kernel)
            out.append(await call_local("propose_candidate", req, Proposal, f"propose_candidate #{first + slot}"))
            for why in out[-1].refused_hints:  # the search ignores it: said where the sender looks
                self._refuse("hint", why)
        return out

    async def submit(self, cand: Candidate, profile_if_crowned: bool = False
                     ) -> tuple[IterationRecord, ProfileReport | None]:
        """Evaluate one candidate as the next iteration and record it (the llm policy's submissions).
        Returns the record as recorded (acceptance may have turned "improved" into "passed") and, with
        `profile_if_crowned`, the profile taken beside a new best's checks (None where none was)."""
        self.set_phase("evaluating")
        iteration = self.st.iteration + 1
        self._launch(iteration, 0, cand, profile_if_crowned)
        failure = await self._drain()
        if failure:
            raise Paused(failure)
        if self.st.iteration < iteration:
            raise Interrupted("the run stopped before the submission's evaluation ended")
        return self.st.last, self.last_profile

    async def _record(self, rec: IterationRecord) -> None:
        # Acceptance is decided here, in iteration order, against the best as it stands now: two
        # parallel slots that both beat the old best cannot both be crowned.
        if rec.outcome == "improved" and not decisions.improves_on(rec, self.st.best):
            rec = rec.model_copy(update={"outcome": "passed"})
        if rec.outcome == "improved":
            self.st.best = BestRef(candidate_id=rec.candidate_id, source_key=rec.source_key,
                                   speedup=rec.speedup, time_ms=rec.time_ms, baseline_ms=rec.baseline_ms,
                                   iteration=rec.iteration, interpreter=rec.interpreter, knobs=rec.knobs,
                                   deciding_dist=rec.deciding_dist)
        if rec.outcome in ("improved", "passed") and rec.speedup is not None:
            self.st.leaderboard = decisions.update_leaderboard(
                self.st.leaderboard,
                LeaderEntry(candidate_id=rec.candidate_id, source_key=rec.source_key, speedup=rec.speedup,
                            time_ms=rec.time_ms, iteration=rec.iteration, knobs=rec.knobs),
                self.spec.top_k, by_time=rec.interpreter)
        assert rec.iteration == self.st.iteration + 1, "iterations are recorded contiguously"
        self.st.iteration = rec.iteration
        self.st.used.iterations += 1
        self.st.used.gpu_seconds += rec.gpu_seconds
        self.st.last = rec
        self.records.append(rec)
        self.iterations_this_run += 1
        self.account_time()
        self.publish()

    # ---- the end: workflows/run_end.py ------------------------------------------------------
    def _carry(self) -> CarriedState:
        st = self.st.model_copy(deep=True)
        st.runs += 1
        st.evaluations = [e for _, e in sorted(self.evaluations.items())]  # they go on: results come by signal
        st.stop = self.stop  # set when the signal came during the compaction before continue-as-new
        return st

    # ---- activity calls ------------------------------------------------------------------------
    async def agent(self, name: str, arg, result_type, minutes: int = 2):
        """An activity on the agent queue; Paused when it fails for infrastructure reasons."""
        return await call_activity(name, arg, result_type, AGENT_QUEUE, minutes, self.spec.heartbeat_seconds,
                                   f"{name} #{self.st.iteration + 1}")

    async def gpu(self, name: str, arg, result_type, minutes: int):
        """An activity on the run's GPU queue, at its front's priority (FRONT); Paused on infrastructure failure."""
        return await call_activity(name, arg, result_type, self.spec.gpu_queue, minutes,
                                   self.spec.heartbeat_seconds, f"{name} #{self.st.iteration + 1}",
                                   interrupted=self.stopping_now if self.gpu_interruptible else None,
                                   priority=FRONT if self.front_first else None)

    # ---- operator controls ---------------------------------------------------------------------
    # The updates take their input raw and validate it themselves: even a `dict` or `int` argument that fails to
    # decode (the plain temporal CLI sends any JSON) reaches the caller as "Failed decoding arguments" instead
    # of saying what the update expects.
    @workflow.update
    def set_budget(self, change: Any) -> Budget:
        new = controls.budget_after(self.spec.budget, self.st.used, change, self.finished)
        self.spec = self.spec.model_copy(update={"budget": new})
        self.publish()
        return self.spec.budget

    @set_budget.validator
    def _check_budget(self, change: Any) -> None:
        controls.budget_after(self.spec.budget, self.st.used, change, self.finished)  # Refused: rejected

    # The same change sent as a signal (`temporal workflow signal --name set_budget`): applied, or refused with
    # the reason in the run's status and details. No command here: only the details change.
    @workflow.signal(name="set_budget")
    def set_budget_signal(self, change: Any = None) -> None:
        try:
            new = controls.budget_after(self.spec.budget, self.st.used, change, self.finished)
        except controls.Refused as e:
            return self._refuse("set_budget", str(e))
        self.spec = self.spec.model_copy(update={"budget": new})
        workflow.set_current_details(self._details())

    # llm policy: the prompt's size cap, changed on a running run (an endpoint with a smaller context)
    @workflow.update
    def set_context_tokens(self, tokens: Any) -> int:
        self.spec = self.spec.model_copy(update={"context_tokens": tokens})
        return tokens

    @set_context_tokens.validator
    def _check_context_tokens(self, tokens: Any) -> None:
        controls.context_tokens(tokens, self.finished)  # Refused: rejected

    # Signals take their input raw and validate it here: a typed argument that fails to decode is dropped by
    # the SDK without a trace, and the sender (the plain temporal CLI) has been told that it was delivered.
    @workflow.signal
    def stop(self, req: Any = None) -> None:
        try:
            self.stop = controls.later_stop(self.stop, controls.stop_request(req))
        except controls.Refused as e:
            return self._refuse("stop", str(e))
        workflow.set_current_details(self._details())

    @workflow.signal
    def pause(self) -> None:
        self.pause_for("paused by operator")

    @workflow.signal
    def resume(self) -> None:
        self.st.paused, self.st.pause_reason = False, ""

    @workflow.signal
    def clear_hints(self) -> None:
        """llm policy: the hints in force (shown every turn, kept in the notebook) are dropped."""
        self.st.llm_hints = []

    @workflow.signal
    def hint(self, h: Any = None) -> None:
        try:
            self.st.hints.append(controls.hint_text(h))
        except controls.Refused as e:
            self._refuse("hint", str(e))

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        self._refuse(name, controls.unknown_signal(name))

    def _refuse(self, name: str, why: str) -> None:
        """A signal not applied: kept, with why, in the status and the details, and logged."""
        self.st.refused = controls.note_refusal(self.st.refused, f"{workflow.now():%Y-%m-%d %H:%M:%S} UTC", name, why)
        workflow.logger.warning("signal %s refused: %s", name, why)
        workflow.set_current_details(self._details())

    @workflow.query
    def status(self) -> Status:
        return run_view.status(workflow.info().workflow_id, self.spec, self.st, self.phase, self.stop)

    @workflow.query
    def leaderboard(self) -> list[LeaderEntry]:
        return self.st.leaderboard

    @workflow.query
    def unledgered(self) -> list[IterationRecord]:
        """This run's records that the ledger does not hold yet (it gets them at the next compaction)."""
        return self.records

    # ---- bookkeeping ---------------------------------------------------------------------------
    def pause_for(self, reason: str) -> None:
        # Takes effect at the loop's next quiet point, which sets the phase to "paused".
        self.st.paused, self.st.pause_reason = True, reason

    async def wait_paused(self, resumed) -> None:
        # No `finally`: a coroutine closed at eviction may not call the workflow's clock, and a pause
        # that ends any other way than resuming stays under way, which `seconds_used` counts.
        self.paused_since = workflow.now().timestamp()
        await workflow.wait_condition(resumed)
        self.st.used.paused_seconds += workflow.now().timestamp() - self.paused_since
        self.paused_since = None

    def account_time(self) -> None:
        self.st.used.seconds = decisions.seconds_used(workflow.now().timestamp(), self.st.started_at,
                                                      self.st.used.paused_seconds, self.paused_since)

    def set_phase(self, phase: Phase) -> None:
        # The search attribute follows the coarse phase (one event per change); `status` is exact.
        self.phase = phase
        if phase in run_view.INDEXED_PHASES:
            workflow.upsert_search_attributes([run_view.PHASE.value_set(phase)])
        workflow.set_current_details(self._details())  # not a command: history is unchanged

    def publish(self) -> None:
        """Web UI: search attributes and the live leaderboard as current details."""
        workflow.upsert_search_attributes(run_view.search_attributes(self.spec, self.st, self.phase))
        workflow.set_current_details(self._details())

    def _details(self) -> str:
        return run_details(self.spec, self.st, self.phase, self.stop)

