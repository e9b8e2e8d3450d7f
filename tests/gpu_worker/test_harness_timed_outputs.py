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


def test_a_buffer_left_in_the_inputs_dict_is_never_handed_to_a_later_call(judge, store):
    """Every timed call is handed the harness's own buffers, refilled: one the candidate left in its dict
    would take the next values in its own layout, untimed (the kernel writes zeros where it gets it back)."""
    b = _benchmark_after_verify(judge, store, "input_buffer_swap")
    assert b.ok, b.reason


def test_honest_benchmark_reports_checked_timed_outputs(ev, store):
    r = req(store, canary("fast"))
    b = ev.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))
    assert b.ok, b.reason
    log = store.get_text(b.log_key)
    # one repetition's outputs checked per block, on each distribution
    assert "[normal] interpreter" in log and "[wide] interpreter" in log
    assert log.count("timed outputs 2 outputs") == 2, log
    assert log.count("6 timed calls fingerprinted, worst ") == 2, log  # every timed call: 2 blocks of 3


def test_a_benchmark_where_nothing_was_verified_measures_the_baseline_error_first(store):
    """The timed calls' bound is the baseline's error measured at the shape: on a worker that verified
    nothing there, on the candidate's first seed (the tolerance floor guessed instead rejected every honest
    bf16 mla_decode kernel on a GPU)."""
    from baselines.registry import get_problem
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    try:
        r = req(store, canary("fast"))
        b = e.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))
        assert b.ok, b.reason
        p = get_problem("softmax")
        shape = e.ctx.shape(p, None)
        assert len(e.refs.baseline_errors(p, shape)) == len(p.distributions)
        assert f"vs bound {e.timed_outputs.timed_output_bound(p, shape):.3e}" in store.get_text(b.log_key)
    finally:
        e.close()
