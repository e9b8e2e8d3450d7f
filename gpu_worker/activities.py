"""Temporal activities of the GPU worker (sync `def`s: the worker runs them in a ThreadPoolExecutor).

They heartbeat while they wait on the sandbox child, so a cancelled or timed-out activity kills its
child process group. Rejections are data (ok=False, stage, reason, log_key); only infrastructure
failures raise: an unreadable/unwritable artifact store becomes a non-retryable ApplicationError.
"""

from __future__ import annotations

import os
import threading
import time

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.artifacts import ArtifactStoreError
from workflows.contracts import BenchReport, BenchRequest, CompileReport, EvalRequest, ProfileReport, VerifyReport

_EV = None
_EV_LOCK = threading.Lock()


def evaluator():
    """The process-wide Evaluator (warm sandbox pool, reference children, cached ceilings)."""
    global _EV
    with _EV_LOCK:
        if _EV is None:
            from gpu_worker.harness import Evaluator, cuda_available
            from gpu_worker.worker import gpu_concurrency

            cuda = cuda_available()
            # warm spares: a candidate child costs seconds to start (torch + Triton imports); on CUDA a
            # rolling population keeps several acquisitions in flight at once. Children handed from one
            # stage to the next: room for every candidate in flight on this worker, twice over
            _EV = Evaluator(spares=int(os.environ.get("MARATHON_SPARES", "4" if cuda else "1")),
                            keep=min(32, 2 * gpu_concurrency(cuda)))
        return _EV


def set_evaluator(ev) -> None:
    """Install a specific Evaluator (tests, worker start-up with a self-test)."""
    global _EV
    with _EV_LOCK:
        _EV = ev


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


def _observed(stage: str, fn, req):
    """Run a harness step, count it (Prometheus) and log it (JSON, with workflow, run and iteration)."""
    from activities.logs import activity_logger
    from activities.metrics import observe_report

    from gpu_worker.harness import phases_begin, phases_end

    t0 = time.monotonic()
    phases_begin()
    rep = _guarded(fn, req)
    observe_report(stage, rep)
    activity_logger().info(stage, iteration=req.iteration, candidate=req.candidate_id, ok=rep.ok,
                           reason=(getattr(rep, "reason", "") or getattr(rep, "error", ""))[:200],
                           seconds=round(time.monotonic() - t0, 3), phases=phases_end())
    return rep


@activity.defn(name="compile_candidate")
def compile_candidate(req: EvalRequest) -> CompileReport:
    return _observed("compile", lambda ev, r: ev.compile(r, _heartbeat()), req)


@activity.defn(name="verify_candidate")
def verify_candidate(req: EvalRequest) -> VerifyReport:
    return _observed("verify", lambda ev, r: ev.verify(r, _heartbeat()), req)


@activity.defn(name="benchmark_candidate")
def benchmark_candidate(req: BenchRequest) -> BenchReport:
    return _observed("benchmark", lambda ev, r: ev.benchmark(r, _heartbeat()), req)


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
