"""Temporal activities of the GPU worker (sync `def`s: the worker runs them in a ThreadPoolExecutor).

Compile, verify and benchmark run on the worker's own threads (SharedCalls), keyed by their request; the
activity waits for that work and heartbeats. A workflow that continues as new carries its evaluations in
flight (CarriedState.in_flight) and asks again with the same requests: it gets the work already under way
or just finished instead of starting over. Rejections are data (ok=False, stage, reason, log_key); only
infrastructure failures raise: an unreadable/unwritable artifact store becomes a non-retryable
ApplicationError.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
import time
from collections import OrderedDict

from temporalio import activity
from temporalio.exceptions import ApplicationError

from workflows.artifacts import ArtifactStoreError
from workflows.contracts import BenchReport, BenchRequest, CompileReport, EvalRequest, ProfileReport, VerifyReport

_EV = None
_EV_LOCK = threading.Lock()


def evaluator():
    """The process-wide Evaluator (warm sandbox pool, reference children, cached ceilings)."""
    global _EV
    with _EV_LOCK:
        if _EV is None:
            from gpu_worker.harness import Evaluator, cuda_available
            from gpu_worker.scheduling import Scheduler
            from gpu_worker.worker import gpu_concurrency

            cuda = cuda_available()
            # warm spares: a candidate child costs seconds to start (torch + Triton imports); on CUDA a
            # rolling population keeps several acquisitions in flight at once. Children handed from one
            # stage to the next: room for every candidate in flight on this worker, twice over
            _EV = Evaluator(scheduler=Scheduler(spares=int(os.environ.get("MARATHON_SPARES", "4" if cuda else "1")),
                                                keep=min(32, 2 * gpu_concurrency(cuda))))
        return _EV


def set_evaluator(ev) -> None:
    """Install a specific Evaluator (tests, worker start-up with a self-test). Results kept for the previous
    one are not handed out for this one: the kept calls start empty."""
    global _EV, CALLS
    with _EV_LOCK:
        _EV = ev
        CALLS = SharedCalls()


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


def _guarded(fn, *args):
    ev = evaluator()
    st = ev.selftest_result
    if st is not None and not st.get("ok"):
        raise ApplicationError("GPU worker self-test failed; refusing work: " + "; ".join(st.get("problems", [])),
                               type="SelfTestFailed", non_retryable=True)
    try:
        return fn(ev, *args)
    except ArtifactStoreError as e:
        raise ApplicationError(f"artifact store failure on the GPU worker: {e}", type="ArtifactStoreError",
                               non_retryable=True) from e


class SharedCalls:
    """Harness calls keyed by their request, run once on a thread of their own: a second caller with the same
    key while the first runs waits for the same result, and one within `keep_s` after it finished gets that
    result. Failures (exceptions) are never kept: a retry runs again.

    Why: a workflow that continues as new abandons its activities in flight; Temporal cancels them (the
    cancellation is raised in the activity's thread). The next run starts the same evaluations again with
    the same requests (CarriedState.in_flight), and without this each would start over, on a GPU pipeline
    that had just emptied. The harness work also no longer receives the cancellation anywhere inside it: it
    ends by its own time limits. Same request, same work: the key is the stage and the whole request, so a
    different best, iteration or fresh-process flag is other work."""

    def __init__(self, keep_s: float = 900.0, keep_max: int = 1024):
        self.keep_s, self.keep_max = keep_s, keep_max
        self._lock = threading.Lock()
        self._running: dict[str, concurrent.futures.Future] = {}
        self._done: OrderedDict[str, tuple[float, object]] = OrderedDict()
        self.counts = {"ran": 0, "joined": 0, "kept": 0}  # new work, joined running work, a kept result

    def submit(self, key: str, fn) -> tuple[concurrent.futures.Future, str]:
        """The future of `key`'s work, and how it came: "ran" (started now), "joined" or "kept"."""
        with self._lock:
            now = time.monotonic()
            while self._done and (len(self._done) > self.keep_max
                                  or now - next(iter(self._done.values()))[0] > self.keep_s):
                self._done.popitem(last=False)
            fut: concurrent.futures.Future = concurrent.futures.Future()
            if key in self._done:
                self.counts["kept"] += 1
                fut.set_result(self._done[key][1])
                return fut, "kept"
            if key in self._running:
                self.counts["joined"] += 1
                return self._running[key], "joined"
            self.counts["ran"] += 1
            self._running[key] = fut
        threading.Thread(target=self._work, args=(key, fn, fut), daemon=True, name=f"shared-{key[:24]}").start()
        return fut, "ran"

    def _work(self, key: str, fn, fut: concurrent.futures.Future) -> None:
        try:
            result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to every waiter
            with self._lock:
                self._running.pop(key, None)
            fut.set_exception(e)
            return
        with self._lock:
            self._running.pop(key, None)
            self._done[key] = (time.monotonic(), result)
        fut.set_result(result)


CALLS = SharedCalls()


def request_key(stage: str, req) -> str:
    return stage + ":" + hashlib.sha256(req.model_dump_json().encode()).hexdigest()


def _observed(stage: str, fn, req, log=None):
    """Run a harness step, count it (Prometheus) and log it (JSON, with workflow, run and iteration)."""
    from workflows.logs import activity_logger
    from workflows.metrics import observe_report

    from gpu_worker.harness import phases_begin, phases_end

    t0 = time.monotonic()
    phases_begin()
    rep = _guarded(fn, req)
    observe_report(stage, rep)
    (log or activity_logger()).info(stage, iteration=req.iteration, candidate=req.candidate_id, ok=rep.ok,
                                    reason=(getattr(rep, "reason", "") or getattr(rep, "error", ""))[:200],
                                    seconds=round(time.monotonic() - t0, 3), phases=phases_end())
    return rep


def _shared(stage: str, fn, req):
    """The harness step on a thread of its own (SharedCalls), awaited here with heartbeats. Its heartbeat
    callback does nothing outside an activity, so a cancellation reaches only this waiting thread."""
    from workflows.logs import activity_logger

    log = activity_logger()  # bound to the activity that started the work: the phase log keeps its run
    t0 = time.monotonic()
    fut, how = CALLS.submit(request_key(stage, req), lambda: _observed(stage, fn, req, log))
    beat = _heartbeat()
    while True:
        try:
            rep = fut.result(timeout=1.0)
            break
        except concurrent.futures.TimeoutError:
            beat()
    if how != "ran":  # the phase log shows where a continued run picked up work under way or done
        log.info("shared-call", stage=stage, how=how, iteration=req.iteration, candidate=req.candidate_id,
                 seconds=round(time.monotonic() - t0, 3))
    return rep


@activity.defn(name="compile_candidate")
def compile_candidate(req: EvalRequest) -> CompileReport:
    return _shared("compile", lambda ev, r: ev.compile(r, _heartbeat()), req)


@activity.defn(name="verify_candidate")
def verify_candidate(req: EvalRequest) -> VerifyReport:
    return _shared("verify", lambda ev, r: ev.verify(r, _heartbeat()), req)


@activity.defn(name="benchmark_candidate")
def benchmark_candidate(req: BenchRequest) -> BenchReport:
    return _shared("benchmark", lambda ev, r: ev.benchmark(r, _heartbeat()), req)


@activity.defn(name="profile_candidate")
def profile_candidate(req: EvalRequest) -> ProfileReport:
    return _guarded(lambda ev, r: ev.profile(r, _heartbeat()), req)


@activity.defn(name="gpu_selftest")
def gpu_selftest() -> dict:
    """Canary self-test on demand. Returns the classification; a failure also makes the worker refuse
    further work until a later self-test passes."""
    ev = evaluator()
    try:
        return ev.selftest(_heartbeat())
    except ArtifactStoreError as e:
        raise ApplicationError(f"artifact store failure on the GPU worker: {e}", type="ArtifactStoreError",
                               non_retryable=True) from e
