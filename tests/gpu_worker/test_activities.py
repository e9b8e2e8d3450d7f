"""The GPU activities (gpu_worker.activities.GpuActivities) in Temporal's activity environment: compile and verify, a
store failure that no retry mends, the self-test and the refusal of work after a failed one, the worker's
activity list."""

from __future__ import annotations

import pytest

from tests.gpu_worker.harnesses import canary, req
from workflows.contracts import EvalRequest


def test_activities_in_activity_environment(ev, store):
    from temporalio.testing import ActivityEnvironment

    from gpu_worker.activities import GpuActivities

    acts = GpuActivities(ev)
    env = ActivityEnvironment()
    r = req(store, canary("fast"))
    c = env.run(acts.compile_candidate, r)
    assert c.ok
    v = env.run(acts.verify_candidate, r)
    assert v.ok and v.interpreter
    bad = env.run(acts.verify_candidate, req(store, canary("wrong")))
    assert not bad.ok and bad.stage == "verify"


def test_artifact_store_failure_is_non_retryable(ev, store, monkeypatch):
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    from workflows.artifacts import ArtifactStoreError
    from gpu_worker.activities import GpuActivities

    acts = GpuActivities(ev)
    r = req(store, canary("wrong"))

    def broken(data):
        raise ArtifactStoreError("artifact store /x is not writable: read-only file system")

    monkeypatch.setattr(store, "put_bytes", broken)
    with pytest.raises(ApplicationError) as ei:
        ActivityEnvironment().run(acts.verify_candidate, r)
    assert ei.value.non_retryable and "not writable" in str(ei.value)


@pytest.mark.slow(25)
def test_selftest_canaries_and_refusal(ev, store, monkeypatch):
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    from gpu_worker.activities import GpuActivities
    from gpu_worker.selftest_verdict import SelfTestVerdict

    monkeypatch.setattr(ev, "selftest_verdict", SelfTestVerdict())  # the module's evaluator keeps its own
    acts = GpuActivities(ev)
    env = ActivityEnvironment()
    res = env.run(acts.gpu_selftest)
    assert res["ok"], res
    assert res["canaries"]["slow"]["verify_ok"] and res["canaries"]["fast"]["verify_ok"]
    assert not res["canaries"]["wrong"]["verify_ok"] and not res["canaries"]["cheat"]["verify_ok"]
    assert ev.selftest_verdict.passed
    # a later self-test that fails makes the worker refuse work; one after it that passes lifts the refusal
    failed = {"ok": False, "problems": ["the wrong canary passed verification"]}
    monkeypatch.setattr("gpu_worker.canaries.run_canaries", lambda e, hb=None: failed)
    assert env.run(acts.gpu_selftest) == failed and ev.selftest_verdict.failed
    r = req(store, canary("fast"))
    with pytest.raises(ApplicationError) as ei:
        env.run(acts.compile_candidate, EvalRequest(problem="softmax", candidate_id="c", source_key="0" * 64))
    # retryable: the work is sound and goes to another worker; this one takes nothing more
    assert ei.value.type == "SelfTestFailed" and not ei.value.non_retryable and "self-test failed" in str(ei.value)
    assert "the wrong canary passed verification" in str(ei.value)
    with pytest.raises(ApplicationError, match="self-test failed"):
        env.run(acts.verify_candidate, r)
    monkeypatch.setattr("gpu_worker.canaries.run_canaries", lambda e, hb=None: res)
    assert env.run(acts.gpu_selftest)["ok"] and ev.selftest_verdict.passed
    assert env.run(acts.compile_candidate, r).ok


def test_worker_builds(ev):
    from gpu_worker.worker import gpu_activities

    names = [f.__temporal_activity_definition.name for f in gpu_activities(ev)]
    assert names == ["compile_candidate", "verify_candidate", "benchmark_candidate", "profile_candidate", "gpu_selftest"]


def test_a_cancelled_step_ends_its_wait_even_where_the_exception_missed_its_thread():
    """A worker stopping past its grace cancels its activities by raising in their threads; one raised as
    the step's thread starts can land there instead (CPython's state for a new thread carries its starter's
    id until it runs). The waiting activity still ends within a heartbeat's second: it reads the
    cancellation itself (here no exception is raised at all, the activity opting out of them)."""
    import threading
    import time

    from temporalio import activity
    from temporalio.exceptions import CancelledError
    from temporalio.testing import ActivityEnvironment

    from gpu_worker import activities as acts
    from gpu_worker.selftest_verdict import SelfTestVerdict
    from workflows.contracts import EvalRequest

    release, out = threading.Event(), {}

    class Ev:
        selftest_verdict = SelfTestVerdict()

    @activity.defn(name="compile_candidate", no_thread_cancel_exception=True)
    def stuck(request: EvalRequest):
        return acts._beating(Ev(), "compile", lambda ev, r: release.wait(60), request)

    env = ActivityEnvironment()

    def run():
        try:
            out["result"] = env.run(stuck, EvalRequest(problem="softmax", candidate_id="c" * 16, source_key="k"))
        except BaseException as e:  # noqa: BLE001 - the outcome under test
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    try:
        time.sleep(1.5)
        env.cancel()
        t.join(10)
        assert not t.is_alive(), "the activity went on waiting for its step after being cancelled"
        assert isinstance(out.get("error"), CancelledError), out
    finally:
        release.set()
        t.join(60)


@pytest.mark.parametrize("key, rank", [(None, None), (2, 2), (1, 1)])
def test_a_step_s_device_jobs_take_their_task_s_priority(key, rank):
    """The queue served the task by its priority (2: the run's oldest unrecorded iteration, 1: a crowned
    candidate's checks); the step's device jobs wait in the same order (gpu_worker.device.turns.UntimedJob)."""
    import dataclasses

    from temporalio import activity
    from temporalio.common import Priority
    from temporalio.testing import ActivityEnvironment

    from gpu_worker import activities as acts
    from gpu_worker.phases import current_rank
    from gpu_worker.selftest_verdict import SelfTestVerdict
    from workflows.contracts import CompileReport

    seen = []

    class Ev:
        selftest_verdict = SelfTestVerdict()

    def step(ev, r):
        seen.append(current_rank())
        return CompileReport(ok=True)

    @activity.defn(name="compile_candidate")
    def compile_candidate(request: EvalRequest):
        return acts._beating(Ev(), "compile", step, request)

    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, priority=Priority(priority_key=key))
    assert env.run(compile_candidate, EvalRequest(problem="softmax", candidate_id="c" * 16, source_key="k")).ok
    assert seen == [rank]
