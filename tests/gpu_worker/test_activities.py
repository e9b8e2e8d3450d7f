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
