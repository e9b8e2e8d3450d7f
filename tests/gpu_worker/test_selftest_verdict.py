"""Timing waits for the start-up self-test's verdict, held by the evaluator (gpu_worker.selftest_verdict,
gpu_worker.activities._await_selftest): compiles and verifications are served while it runs, a benchmark
heartbeats until its verdict and then times or, after a failure, raises a retryable SelfTestFailed
(infrastructure, never a report against the candidate). The self-test's outcome is set by hand here; the
canaries themselves are test_activities'."""

from __future__ import annotations

import threading
import time

import pytest

from gpu_worker.selftest_verdict import SelfTestVerdict
from tests.gpu_worker.harnesses import canary, req

FAILED = {"ok": False, "problems": ["the wrong canary passed verification"]}


def test_a_wait_heartbeats_until_the_verdict():
    verdict = SelfTestVerdict()
    beats = []
    with pytest.raises(TimeoutError, match="no verdict within 1.5 s"):
        verdict.wait(1.5, lambda: beats.append(time.monotonic()))
    assert beats and not verdict.settled and not verdict.passed and not verdict.failed
    threading.Timer(1.2, verdict.settle, args=({"ok": True, "problems": []},)).start()
    assert verdict.wait(30, lambda: beats.append(time.monotonic())) is True
    assert verdict.passed and not verdict.failed and verdict.problems == [] and len(beats) >= 2
    failed = SelfTestVerdict()
    failed.settle(FAILED)
    assert failed.wait(0.1) is False and failed.failed and not failed.passed and failed.problems == FAILED["problems"]


def test_a_later_verdict_replaces_the_earlier():
    verdict = SelfTestVerdict()
    verdict.settle(FAILED)
    verdict.settle({"ok": True, "problems": []})
    assert verdict.passed and not verdict.failed and verdict.problems == []
    verdict.settle(FAILED)
    assert verdict.failed and not verdict.passed and verdict.problems == FAILED["problems"]


class _Benchmark:
    """benchmark_candidate in Temporal's activity environment on a thread of its own, its heartbeats counted."""

    def __init__(self, r, acts):
        from temporalio.testing import ActivityEnvironment

        self.beats, self.result, self.error = 0, None, None
        env = ActivityEnvironment()
        env.on_heartbeat = lambda *_: setattr(self, "beats", self.beats + 1)

        def run():
            try:
                self.result = env.run(acts.benchmark_candidate, r.bench())
            except BaseException as e:  # noqa: BLE001 - inspected by the test
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def until_beating(self, n: int = 2, within: float = 30):
        deadline = time.monotonic() + within
        while self.beats < n and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.beats >= n and self.thread.is_alive(), (self.beats, self.error)


@pytest.fixture
def gated(ev, monkeypatch):
    """A start-up self-test awaited and still pending on the interpreter's evaluator, whose benchmarks are
    counted as they start."""
    from gpu_worker.activities import GpuActivities

    started = []
    real = ev.benchmark
    monkeypatch.setattr(ev, "benchmark", lambda r, hb=None: (started.append(r.candidate_id), real(r, hb))[1])
    verdict = SelfTestVerdict()
    monkeypatch.setattr(ev, "selftest_verdict", verdict)
    yield verdict, started, GpuActivities(ev, selftest_awaited=True)


def _until_started(started, n=1, within=120):
    deadline = time.monotonic() + within
    while len(started) < n and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_benchmark_runs_beside_the_selftest_and_its_report_waits_for_the_pass(gated, store):
    from temporalio.testing import ActivityEnvironment

    verdict, started, acts = gated
    r = req(store, canary("fast"))
    bench = _Benchmark(r, acts)
    _until_started(started)
    bench.until_beating()
    # the self-test still runs: compile and verification go on; the benchmark ran, its report is held
    env = ActivityEnvironment()
    assert env.run(acts.compile_candidate, r).ok and env.run(acts.verify_candidate, r).ok
    assert bench.thread.is_alive() and bench.result is None and started == [r.candidate_id]
    verdict.settle({"ok": True, "problems": []})
    bench.thread.join(600)
    assert bench.error is None and bench.result is not None and bench.result.ok, (bench.error, bench.result)
    assert started == [r.candidate_id]


def test_a_failed_selftest_fails_the_waiting_benchmark_as_infrastructure(gated, store):
    from temporalio.exceptions import ApplicationError

    verdict, started, acts = gated
    r = req(store, canary("slow"))
    bench = _Benchmark(r, acts)
    _until_started(started)
    bench.until_beating()
    verdict.settle(FAILED)
    bench.thread.join(30)
    assert not bench.thread.is_alive() and bench.result is None
    err = bench.error
    # retryable: a retry goes to another worker; a report would have been a verdict on the candidate
    assert isinstance(err, ApplicationError) and err.type == "SelfTestFailed" and not err.non_retryable
    assert "the wrong canary passed verification" in str(err)
    later = _Benchmark(r, acts)  # and so does every benchmark after it, at once
    later.thread.join(30)
    assert isinstance(later.error, ApplicationError) and later.error.type == "SelfTestFailed" and later.beats == 0
    assert started == [r.candidate_id]  # the first ran beside the self-test, its report never left; none since
