"""Temporal activities of the GPU worker (sync `def`s: the worker runs them in a ThreadPoolExecutor).

Each harness step runs on a thread of its own while the activity thread heartbeats every second, so a long
device step never misses a heartbeat and a cancellation reaches only the waiting activity thread (the
harness step ends by its own time limits). Rejections are data (ok=False, stage, reason, log_key); only
infrastructure failures raise: an unreadable/unwritable artifact store becomes a non-retryable
ApplicationError; a failed self-test a retryable one (type SelfTestFailed), which another worker can take.

The self-test's verdict has one holder, the evaluator's `selftest_verdict` (settled by Evaluator.selftest):
after a failed verdict every activity refuses. While a start-up self-test runs (`GpuActivities.selftest_awaited`),
a benchmark or profile runs beside it and its report waits for the verdict (a failure turns it into the
refusal); compiles and verifications do not wait.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time

from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError

from gpu_worker.harness import Evaluator
from gpu_worker.phases import phases_begin, phases_end, set_rank
from gpu_worker.device.scheduling import Scheduler
from gpu_worker.settings import GpuWorkerSettings, cuda_available
from workflows.artifacts import ArtifactStoreError
from workflows.contracts import (SELFTEST_FAILED, BenchReport, BenchRequest, CompileReport, EvalRequest, ProfileReport,
                                VerifyReport)
from workflows.logs import activity_logger
from workflows.metrics import observe_report

_EV = None
_EV_LOCK = threading.Lock()
#: a benchmark waits this long for the self-test's verdict: below its 20-minute start-to-close timeout, so a
#: self-test that never ends fails the wait as infrastructure instead of timing the activity out
SELFTEST_WAIT_S = 15 * 60


def evaluator(settings: GpuWorkerSettings | None = None):
    """The process-wide Evaluator (warm sandbox pool, reference children, cached ceilings). The first call
    builds it with `settings`, by default the worker's environment parsed once here (a bad value raises
    SettingsError, naming the variable); later calls return it as built."""
    global _EV
    with _EV_LOCK:
        if _EV is None:
            s = settings or GpuWorkerSettings.from_env(os.environ)
            cuda = cuda_available(s)
            s = s.for_device(cuda)
            _EV = Evaluator(interpreter=not cuda, scheduler=Scheduler.for_worker(s), settings=s)
        return _EV


def set_evaluator(ev) -> None:
    """Install a specific Evaluator (tests, worker start-up with a self-test)."""
    global _EV
    with _EV_LOCK:
        _EV = ev


def selftest_refusal(problems: list[str]) -> ApplicationError:
    """Retryable: the work is sound, this worker is not; a retry goes to a worker that passed its self-test."""
    return ApplicationError("GPU worker self-test failed; this worker judges nothing more: " + "; ".join(problems),
                            type=SELFTEST_FAILED)


def _heartbeat():
    last = [0.0]

    def hb():
        now = time.monotonic()
        if now - last[0] < 2.0:
            return
        last[0] = now
        try:
            activity.heartbeat()
        except RuntimeError:  # not running inside an activity (direct call from a script or test)
            pass

    return hb


def _guarded(ev, fn, *args):
    verdict = ev.selftest_verdict
    if verdict.failed:
        raise selftest_refusal(verdict.problems)
    try:
        return fn(ev, *args)
    except ArtifactStoreError as e:
        raise ApplicationError(f"artifact store failure on the GPU worker: {e}", type="ArtifactStoreError",
                               non_retryable=True) from e


#: a refusal's reason in the worker's log: enough for a proof's process log and ncu's own line
REASON_LOGGED = 1500


def _observed(ev, stage: str, fn, req, log):
    """Run a harness step, count it (Prometheus) and log it (JSON, with workflow, run and iteration)."""
    t0 = time.monotonic()
    phases_begin()
    rep = _guarded(ev, fn, req)
    observe_report(stage, rep)
    log.info(stage, iteration=req.iteration, candidate=req.candidate_id, ok=rep.ok,
             reason=(getattr(rep, "reason", "") or getattr(rep, "error", ""))[:REASON_LOGGED],
             seconds=round(time.monotonic() - t0, 3), phases=phases_end())
    return rep


def _shielded():
    # outside an activity (a direct call from a script or test) nothing is cancelled
    return activity.shield_thread_cancel_exception() if activity.in_activity() else contextlib.nullcontext()


def _cancelled() -> bool:
    return activity.in_activity() and activity.is_cancelled()


def _beating(ev, stage: str, fn, req):
    """The harness step on a thread of its own, awaited here with a heartbeat every second. Its own
    heartbeat callback does nothing outside the activity's thread. Once the activity is cancelled (a worker
    stopping past its grace) the wait ends, even where the cancellation's exception did not reach this
    thread; the step ends on its own thread by its own time limits."""
    log = activity_logger()  # bound to this activity: the phase log keeps its run
    fut: concurrent.futures.Future = concurrent.futures.Future()
    # the task's priority ranks the step's device jobs as the queue ranked the task (0: none given)
    rank = (activity.info().priority.priority_key or None) if activity.in_activity() else None

    def work():
        set_rank(rank)
        try:
            fut.set_result(_observed(ev, stage, fn, req, log))
        except BaseException as e:  # noqa: BLE001 - raised again in the activity's thread
            fut.set_exception(e)

    step = threading.Thread(target=work, daemon=True, name=f"{stage}-{req.candidate_id[:16]}")
    # until a new thread runs, CPython's state for it carries this thread's id: a cancellation raised here
    # meanwhile would land in the step's thread, which would die unstarted and leave this wait unanswered
    with _shielded():
        step.start()
    beat = _heartbeat()
    while True:
        try:
            return fut.result(timeout=1.0)
        except concurrent.futures.TimeoutError:
            if _cancelled():
                raise CancelledError(f"the {stage} was cancelled while it ran")
            beat()


class GpuActivities:
    """The GPU worker's activities over its evaluator. `own_queue`: the queue only this worker polls, named
    in compile reports; `selftest_awaited`: a start-up self-test runs, so a timed stage's report waits for
    its verdict."""

    def __init__(self, ev, own_queue: str | None = None, selftest_awaited: bool = False) -> None:
        self.ev, self.own_queue, self.selftest_awaited = ev, own_queue, selftest_awaited

    def _await_selftest(self) -> None:
        """Before a timed stage's report leaves: the start-up self-test's verdict, heartbeating while it is
        pending. The stage itself ran meanwhile: the canaries judge this harness on this host, and a report
        made before their verdict is held until it, never sent where they failed."""
        if not self.selftest_awaited:
            return
        verdict = self.ev.selftest_verdict
        if verdict.passed:
            return
        t0 = time.monotonic()
        try:
            passed = verdict.wait(SELFTEST_WAIT_S, _heartbeat())
        except TimeoutError as e:
            raise ApplicationError(str(e), type="SelfTestPending") from e
        if not passed:
            raise selftest_refusal(verdict.problems)
        activity_logger().info("selftest-wait", seconds=round(time.monotonic() - t0, 3))

    @activity.defn(name="compile_candidate")
    def compile_candidate(self, req: EvalRequest) -> CompileReport:
        rep = _beating(self.ev, "compile", lambda ev, r: ev.compile(r, _heartbeat()), req)
        # a compile that ends while this worker stops names no queue of its own: the candidate's later
        # stages go to the shared queue at once rather than wait out their timeout on one nobody polls
        if rep.ok and self.own_queue and not activity.is_worker_shutdown():
            return rep.model_copy(update={"worker_queue": self.own_queue})
        return rep

    @activity.defn(name="verify_candidate")
    def verify_candidate(self, req: EvalRequest) -> VerifyReport:
        return _beating(self.ev, "verify", lambda ev, r: ev.verify(r, _heartbeat()), req)

    @activity.defn(name="benchmark_candidate")
    def benchmark_candidate(self, req: BenchRequest) -> BenchReport:
        rep = _beating(self.ev, "benchmark", lambda ev, r: ev.benchmark(r, _heartbeat()), req)
        self._await_selftest()
        return rep

    @activity.defn(name="profile_candidate")
    def profile_candidate(self, req: EvalRequest) -> ProfileReport:
        rep = _guarded(self.ev, lambda ev, r: ev.profile(r, _heartbeat()), req)
        self._await_selftest()
        return rep

    @activity.defn(name="gpu_selftest")
    def gpu_selftest(self) -> dict:
        """Canary self-test on demand. Returns the classification and settles the evaluator's verdict with
        it: a failure makes the worker refuse further work until a later self-test passes."""
        try:
            return self.ev.selftest(_heartbeat())
        except ArtifactStoreError as e:
            raise ApplicationError(f"artifact store failure on the GPU worker: {e}", type="ArtifactStoreError",
                                   non_retryable=True) from e

    def all(self) -> list:
        return [self.compile_candidate, self.verify_candidate, self.benchmark_candidate, self.profile_candidate,
                self.gpu_selftest]
