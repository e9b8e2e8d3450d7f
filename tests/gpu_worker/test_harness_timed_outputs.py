"""The checks of what timed calls returned (gpu_worker.harness.timed_outputs): work skipped while timed, on
every timed call or on some, is rejected; an honest benchmark reports the outputs and fingerprints it
checked."""

from __future__ import annotations

from tests.gpu_worker.harnesses import canary, kernel, req
from workflows.contracts import BenchRequest


def _benchmark_after_verify(judge, store, name: str):
    """The kernel `name` compiled, verified (right while it is checked) and then benchmarked."""
    r = req(store, kernel(name))
    assert judge.compile(r).ok
    assert judge.verify(r).ok
    return judge.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))


def test_work_skipped_while_timed_is_rejected(judge, store):
    b = _benchmark_after_verify(judge, store, "timed_skip")
    assert not b.ok and b.stage == "benchmark", b
    assert b.reason.startswith("timed-output"), b.reason


def test_work_skipped_on_some_timed_calls_is_rejected_by_their_fingerprints(judge, store):
    b = _benchmark_after_verify(judge, store, "timed_skip_some")
    assert not b.ok and b.stage == "benchmark", b
    assert b.reason.startswith("timed-output: timed call ") and "'y' does not match" in b.reason, b.reason


def test_honest_benchmark_reports_checked_timed_outputs(ev, store):
    r = req(store, canary("fast"))
    b = ev.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))
    assert b.ok, b.reason
    log = store.get_text(b.log_key)
    # one repetition's outputs checked per block, on each distribution
    assert "[normal] interpreter" in log and "[wide] interpreter" in log
    assert log.count("timed outputs 2 outputs") == 2, log
    assert log.count("6 timed calls fingerprinted, worst ") == 2, log  # every timed call: 2 blocks of 3
    # no verification ran on this worker: the timed calls' bound is the baseline's error measured for it
    # (an output-precision floor guessed instead failed every honest bf16 mla_decode kernel on a GPU)
    from baselines.registry import get_problem

    p = get_problem("softmax")
    errs = ev.refs.baseline_errors(p, ev.ctx.shape(p, None))
    assert len(errs) == len(p.distributions), errs
    assert f"vs bound {ev.timed_outputs.timed_output_bound(p, ev.ctx.shape(p, None)):.3e}" in log, log
