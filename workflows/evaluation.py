"""EvaluateCandidate: one candidate's whole evaluation as one durable unit, a child workflow of the run.

rules -> compile -> verify -> benchmark, and a would-be best re-measured in a fresh process and verified
again, at one more of the problem's shapes and at a random one, the two checks at once. The run starts it
with ParentClosePolicy.ABANDON and does not wait on it: the child signals its result to the run's workflow id
(`evaluated`), which reaches the run's latest execution, so an evaluation under way goes on across the
run's continue-as-new and the GPU pipeline never drains for a compaction.

Deterministic: activity calls and decisions only. Also the activity-call helpers the loop shares
(`Paused`: an infrastructure failure that outlived its retries).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType, is_cancelled_exception
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from workflows import decisions
    from workflows.contracts import (
        BenchReport, CompileReport, CrownDecision, EvalRequest, EvaluateRequest, EvaluationResult, IterationRecord,
        SELFTEST_FAILED, ProfileReport, RuleReport, RuleRequest, VerifyReport,
    )

EVALUATE_TYPE = "EvaluateCandidate"
RESULT_SIGNAL = "evaluated"
CROWN_SIGNAL = "crown"  # the run's answer to a would-be best's candidacy
# a would-be best is also verified at a random shape, where the harness lists no other shape too
RANDOM_SHAPE_PATCH = "random-shape-for-bests"
# a candidate's stages after compile go to the compiling GPU worker's own queue (CompileReport.worker_queue)
STICKY_PATCH = "one-worker-per-candidate"
#: a stage waits this many heartbeat periods for the candidate's worker to take it from its own queue ...
STICKY_WAIT_HEARTBEATS = 5
#: ... and a candidate is evaluated again from compile at most this often after its worker went away
REDOS = 3
# a stage on a worker's own queue is scheduled one attempt at a time: an attempt that ended with its worker
# (a heartbeat timeout, the worker's shutdown) sends the candidate back to compile elsewhere at once, not
# after retries that each wait five heartbeats on a queue nobody polls
OWN_QUEUE_ONCE_PATCH = "own-queue-stages-once"
# a would-be best's checks (fresh re-measure, other shapes) run only once the run finds it would crown it
CROWN_PATCH = "best-checks-when-crowned"
# ... and go first on their worker's queue: the run records nothing after this iteration until they end
FIRST_PATCH = "best-checks-first"
FIRST = Priority(priority_key=1)  # the default is 3
# the run's oldest unrecorded iteration (`front`): its stages go before those of candidates behind it, whose
# verdicts the run could not record before its own anyway; a would-be best's checks still go before them
FRONT_SIGNAL = "front"
FRONT = Priority(priority_key=2)
CANDIDACY_WAIT = timedelta(days=1)  # a run that never answers has ended: the candidate is recorded as passed
# a crowned candidate's fresh-process re-measure and its verification at other shapes run at once
TOGETHER_PATCH = "best-checks-together"
# a crowned candidate's profile, where the request asks for one, runs beside its best-only checks
PROFILE_PATCH = "profile-beside-best-checks"

# Activity failures that are infrastructure (not the candidate's fault) and survive retries pause the
# run instead of failing it: nothing is lost, and `resume` tries the step again once it is fixed.
RETRY = RetryPolicy(maximum_attempts=5, initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=30))
ONCE = RetryPolicy(maximum_attempts=1)


class Paused(Exception):
    """An activity failed for infrastructure reasons after its retries: the run pauses with the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Interrupted(Paused):
    """A stop with `now` came while an activity waited (for a worker, or to end): it was cancelled."""


class WorkerGone(Exception):
    """A stage sent to a GPU worker's own queue was not taken within its schedule-to-start timeout: the
    worker that loaded the candidate has gone (its queue dies with it; a restarted worker has a new one)."""


class Rejected(Exception):
    """A candidate fell out of the pipeline; carries its record fields."""

    def __init__(self, stage: str, reason: str, **extra) -> None:
        super().__init__(reason)
        self.stage, self.reason, self.extra = stage, reason, extra


async def call_activity(name: str, arg, result_type, queue: str, minutes: int, heartbeat_seconds: int,
                        summary: str, start_within: timedelta | None = None, interrupted=None, once: bool = False,
                        priority: Priority | None = None):
    """An activity on `queue`; an infrastructure failure that outlives the retries raises Paused. With
    `start_within` (a worker's own queue), a stage nobody takes from the queue in time raises WorkerGone;
    with `once` too, each attempt is scheduled alone, and one that ends because the worker went (a timeout, its
    shutdown) raises WorkerGone at once, where the server's retry would wait on a queue nobody polls; an error
    under a live worker is tried again there as RETRY would. With `interrupted` (a condition), the activity is
    cancelled, or not scheduled, once it holds: Interrupted. `priority`: its place in the queue's backlog
    (FIRST before the default)."""
    once = once and start_within is not None
    kw = dict(result_type=result_type, task_queue=queue, start_to_close_timeout=timedelta(minutes=minutes),
              heartbeat_timeout=timedelta(seconds=heartbeat_seconds), retry_policy=ONCE if once else RETRY,
              summary=summary, schedule_to_start_timeout=start_within)
    if priority is not None:
        kw["priority"] = priority
    for attempt in range(1, RETRY.maximum_attempts + 1):
        try:
            return await _attempt(name, arg, kw, interrupted)
        except ActivityError as e:
            if is_cancelled_exception(e):
                raise  # the workflow itself was cancelled (a stop with `now`): it ends cancelled, not paused
            if start_within is not None and isinstance(e.cause, ActivityTimeout) \
                    and e.cause.type == TimeoutType.SCHEDULE_TO_START:
                raise WorkerGone(f"{name} was not taken from {queue} within {start_within.total_seconds():.0f} s") \
                    from e
            msg = decisions.trim(str(e.cause) if e.cause is not None else str(e), 300)
            if once and _worker_went(e):
                raise WorkerGone(f"{name} ended on {queue} with its worker: {msg}") from e
            retryable = not (isinstance(e.cause, ApplicationError) and e.cause.non_retryable)
            if not (once and retryable and attempt < RETRY.maximum_attempts):
                raise Paused(f"{name} failed: {msg}") from e
        await workflow.sleep(min(RETRY.initial_interval * 2 ** (attempt - 1), RETRY.maximum_interval))


async def _attempt(name: str, arg, kw: dict, interrupted):
    """The activity run once (with the server's retries that `kw` names); with `interrupted`, cancelled, or
    not scheduled, once that holds: Interrupted."""
    if interrupted is None:
        return await workflow.execute_activity(name, arg, **kw)
    if interrupted():
        raise Interrupted(f"{name} was not run: the run is stopping now")
    handle = workflow.start_activity(name, arg, **kw)
    await workflow.wait_condition(lambda: handle.done() or interrupted())
    if not handle.done():
        handle.cancel()  # TRY_CANCEL: resolved at once, even where no worker polls the queue
        try:
            await handle
        except (ActivityError, asyncio.CancelledError):
            pass
        raise Interrupted(f"{name} was cancelled: the run is stopping now")
    return await handle


def _worker_went(e: ActivityError) -> bool:
    """The attempt ended because its worker did: it stopped heartbeating, overran, shut down under it, or
    refuses all work since its self-test failed."""
    cause = e.cause
    return isinstance(cause, ActivityTimeout) or (
        isinstance(cause, ApplicationError) and cause.type in ("WorkerShutdown", SELFTEST_FAILED))


async def call_local(name: str, arg, result_type, summary: str):
    """Short CPU-only agent steps (the search proposer, the static rule check) run as local activities:
    recorded in history like any activity, without two trips through the server's task queues."""
    try:
        return await workflow.execute_local_activity(
            name, arg, result_type=result_type, start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RETRY, summary=summary)
    except ActivityError as e:
        msg = str(e.cause) if e.cause is not None else str(e)
        raise Paused(f"{name} failed: {decisions.trim(msg, 300)}") from e
    except ApplicationError as e:
        # A local activity's failure can also arrive as its cause alone, without the ActivityError around it
        # (after a workflow task timed out and was retried): it pauses the run as well.
        raise Paused(f"{name} failed: {decisions.trim(str(e), 300)}") from e


@workflow.defn(name=EVALUATE_TYPE)
class EvaluateCandidate:
    verdict: CrownDecision | None = None  # the run's answer to this evaluation's candidacy (`crown`)
    front = False  # whether the run has said this is its oldest unrecorded iteration (`front`)

    @workflow.run
    async def run(self, req: EvaluateRequest) -> EvaluationResult:
        me = workflow.info().workflow_id
        self.random_shapes = workflow.patched(RANDOM_SHAPE_PATCH)  # decided in the first activation
        self.sticky = workflow.patched(STICKY_PATCH)
        self.crown_once = workflow.patched(CROWN_PATCH)
        self.together = workflow.patched(TOGETHER_PATCH)
        self.profile_beside = workflow.patched(PROFILE_PATCH)
        self.own_queue_once = workflow.patched(OWN_QUEUE_ONCE_PATCH)
        self.checks_first = workflow.patched(FIRST_PATCH)
        self.profile: ProfileReport | None = None  # a new best's, taken beside its checks
        self.front = self.front or req.front  # the run's oldest unrecorded iteration: see FRONT_SIGNAL
        try:
            record, facts = await self.evaluate(req)
            result = EvaluationResult(iteration=req.iteration, workflow_id=me, record=record, device_facts=facts,
                                      profile=self.profile)
        except Paused as p:
            result = EvaluationResult(iteration=req.iteration, workflow_id=me, failure=p.reason)
        parent = workflow.info().parent
        if parent is not None:
            try:
                await workflow.get_external_workflow_handle(parent.workflow_id).signal(RESULT_SIGNAL, result)
            except Exception as e:  # noqa: BLE001 - the run has ended (terminated): nobody waits for this result
                workflow.logger.info("result of #%s not delivered: %s", req.iteration, e)
        return result

    async def candidacy(self, req: EvaluateRequest, record: IterationRecord) -> CrownDecision | None:
        """Tell the run this candidate would be a new best, and wait for its decision (`crown`), taken when
        the run records this iteration. None: no run answers (it ended, or took longer than a day)."""
        parent = workflow.info().parent
        if parent is None:  # evaluated on its own: nobody else decides
            return CrownDecision(crown=True, best=req.best)
        me = workflow.info().workflow_id
        try:
            await workflow.get_external_workflow_handle(parent.workflow_id).signal(
                RESULT_SIGNAL, EvaluationResult(iteration=req.iteration, workflow_id=me, record=record,
                                                candidacy=True))
            await workflow.wait_condition(lambda: self.verdict is not None, timeout=CANDIDACY_WAIT)
        except Exception as e:  # noqa: BLE001 - the run has ended or went silent: recorded as passed, unchecked
            workflow.logger.info("candidacy of #%s not decided: %s", req.iteration, e)
            return None
        return self.verdict

    @staticmethod
    async def profile_taken(profiling: asyncio.Task) -> ProfileReport:
        """The profile's report; one that failed past its retries is a failed report (the verdict stands)."""
        try:
            return await profiling
        except Paused as p:
            return ProfileReport(ok=False, summary=p.reason)

    @workflow.signal(name=CROWN_SIGNAL)
    def crown(self, decision: CrownDecision) -> None:
        self.verdict = decision

    @workflow.signal(name=FRONT_SIGNAL)
    def at_front(self) -> None:
        self.front = True

    async def evaluate(self, req: EvaluateRequest):
        cand = req.candidate
        base = dict(iteration=req.iteration, slot=req.slot, candidate_id=cand.candidate_id,
                    source_key=cand.source_key, knobs=cand.knobs, rationale=cand.rationale,
                    started_at=req.started_at)
        ev = EvalRequest(problem=req.problem, candidate_id=cand.candidate_id, source_key=cand.source_key,
                         shape=req.shape, iteration=req.iteration, next_stage=True)
        facts = None
        profiling: asyncio.Task | None = None  # a crowned candidate's profile, under way beside its checks
        shared = req.gpu_queue
        # a worker's own queue that nobody polls for this long belongs to a worker that went away
        start_within = timedelta(seconds=STICKY_WAIT_HEARTBEATS * req.heartbeat_seconds)

        async def gpu(name, arg, result_type, minutes, queue=shared, priority=None):
            priority = priority or (FRONT if self.front else None)
            return await call_activity(name, arg, result_type, queue, minutes, req.heartbeat_seconds,
                                       f"{name} #{req.iteration}", start_within if queue != shared else None,
                                       once=self.own_queue_once, priority=priority)

        judged_at = 0.0  # once its benchmark has answered: a check after it that refuses keeps this time
        try:
            rules = await call_local("check_rules", RuleRequest(problem=req.problem, source_key=cand.source_key),
                                     RuleReport, f"check_rules #{req.iteration}")
            if not rules.ok:
                raise Rejected("rules", f"{rules.rule}: {rules.detail}")
            redo = 0
            while True:
                try:
                    comp = await gpu("compile_candidate", ev, CompileReport, 15)
                    if not comp.ok:
                        raise Rejected("compile", comp.error, log_key=comp.log_key, interpreter=comp.interpreter)
                    # the later stages go to the worker that compiled the candidate, where its child waits loaded
                    queue = comp.worker_queue if self.sticky and comp.worker_queue else shared
                    ver = await gpu("verify_candidate", ev, VerifyReport, 20, queue)
                    if not ver.ok:
                        raise Rejected(ver.stage, ver.reason, rel_err=ver.rel_err, log_key=ver.log_key,
                                       interpreter=ver.interpreter)
                    best = req.best
                    bench = await gpu("benchmark_candidate", ev.bench(best=best), BenchReport, 20, queue)
                    break
                except WorkerGone as gone:
                    # the worker holding the candidate went away: evaluated again from compile on the shared
                    # queue, wherever it lands; nothing of it was recorded
                    redo += 1
                    if redo > REDOS:
                        raise Paused(f"{gone}; {REDOS} evaluations again from compile met the same") from gone
                    workflow.logger.info("#%s evaluated again from compile: %s", req.iteration, gone)

            async def on_worker(name, arg, result_type, minutes):
                """A would-be best's checks on the candidate's worker; once it has gone, on the shared queue
                (each of these loads the candidate afresh anyway), before the stages of candidates behind it."""
                nonlocal queue
                first = FIRST if self.checks_first else None
                try:
                    return await gpu(name, arg, result_type, minutes, queue, first)
                except WorkerGone:
                    queue = shared
                    return await gpu(name, arg, result_type, minutes, queue, first)

            gpu_s, facts = bench.gpu_seconds, bench.device_facts
            judged_at = workflow.now().timestamp()
            if not bench.ok:
                raise Rejected(bench.stage, bench.reason, log_key=bench.log_key, interpreter=bench.interpreter,
                               gpu_seconds=gpu_s)
            def record(outcome, bench=bench):
                return IterationRecord(
                    **base, outcome=outcome, time_ms=bench.time_ms, baseline_ms=bench.baseline_ms,
                    speedup=bench.speedup, speedup_ci=bench.speedup_ci, vs_best_ci=bench.vs_best_ci,
                    vs_best=bench.vs_best, rel_err=ver.rel_err, interpreter=bench.interpreter, gpu_seconds=gpu_s,
                    log_key=bench.log_key, deciding_dist=bench.deciding_dist, host_ms=bench.host_ms,
                    baseline_host_ms=bench.baseline_host_ms, judged_at=judged_at,
                    finished_at=workflow.now().timestamp())

            async def at_other_shapes():
                """A new best is verified again: at one more listed shape where the problem has one, and at
                a shape the harness draws from the problem's random space (None: no such shape). A kernel
                correct only where it was verified fails."""
                if not (ver.other_shapes or self.random_shapes):
                    return None
                other = ver.other_shapes[0] if ver.other_shapes else req.shape
                again = {"shape": other, "random_shape": True} if self.random_shapes else {"shape": other}
                at = await on_worker("verify_candidate", ev.model_copy(update=again), VerifyReport, 20)
                if at.ok:
                    return None
                reason = at.reason if other == req.shape or at.reason.startswith("shape-specific:") else \
                    f"shape-specific: correct at {req.shape or 'the primary shape'}, not at {other}: {at.reason}"
                return Rejected(at.stage, reason, rel_err=at.rel_err, log_key=at.log_key,
                                interpreter=at.interpreter)

            async def re_measured(best):
                """A new best re-measured in a fresh process, head to head with `best`, before it is
                believed: the confirming report, or None."""
                nonlocal gpu_s
                again = await on_worker("benchmark_candidate", ev.bench(best=best, fresh_process=True),
                                        BenchReport, 20)
                gpu_s += again.gpu_seconds
                return again if again.ok and decisions.improves_on(again, best) else None

            outcome, shape_check, shapes_checked = "passed", None, False
            if self.crown_once:
                if decisions.improves_on(bench, best):
                    # A would-be best pays for the best-only checks only once the run, recording in iteration
                    # order, finds it would crown it now: a sibling that would be demoted is not checked.
                    verdict = await self.candidacy(req, record("improved"))
                    if verdict is not None and verdict.crown:
                        if self.profile_beside and req.profile_if_crowned and not bench.interpreter:
                            profiling = asyncio.create_task(on_worker("profile_candidate", ev, ProfileReport, 20))
                        best = verdict.best  # the best as it stands now: the re-measure meets it head to head
                        if best is not None and not bench.interpreter:
                            if self.together:
                                # both checks at once: a new best's verdict waits for the longer, not the sum
                                confirmed, shape_check = await asyncio.gather(re_measured(best),
                                                                              at_other_shapes())
                                shapes_checked = True
                            else:
                                confirmed = await re_measured(best)
                            if confirmed is not None:
                                bench, outcome = confirmed, "improved"
                        else:
                            outcome = "improved"
            elif decisions.improves_on(bench, best) and best is not None and not bench.interpreter:
                confirmed = await re_measured(best)
                if confirmed is not None:
                    bench, outcome = confirmed, "improved"
            elif decisions.improves_on(bench, best):
                outcome = "improved"
            if outcome == "improved" and not shapes_checked:
                shape_check = await at_other_shapes()
            if outcome == "improved" and shape_check is not None:
                shape_check.extra["gpu_seconds"] = gpu_s
                raise shape_check
            if profiling is not None and outcome == "improved":
                self.profile = await self.profile_taken(profiling)
            return record(outcome, bench), facts
        except Rejected as r:
            now = workflow.now().timestamp()
            return IterationRecord(**base, outcome="rejected", stage=r.stage, reason=decisions.trim(r.reason),
                                   judged_at=judged_at or now, finished_at=now, **r.extra), facts
        finally:
            if profiling is not None and not profiling.done():  # not confirmed, or failed: nobody reads it
                profiling.cancel()
