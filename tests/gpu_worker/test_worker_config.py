"""GPU worker start-up configuration (no GPU, no server)."""

from __future__ import annotations

import pytest

from baselines.registry import UnknownProblem
from gpu_worker.worker import warm_list


def test_warm_list_takes_problems_and_shapes():
    assert warm_list("") == []
    assert warm_list("kda") == [("kda", None)]
    assert warm_list(" kda , mla_decode:B1 H64 S8192 Q4 ") == [("kda", None), ("mla_decode", "B1 H64 S8192 Q4")]
    assert warm_list("kda", default_shape="B1 T32768 H32 D128") == [("kda", "B1 T32768 H32 D128")]


def test_warm_list_refuses_an_unknown_problem_at_start():
    with pytest.raises(UnknownProblem, match="unknown problem 'kdaa'"):
        warm_list("kda,kdaa")


def test_kernels_over_the_shared_memory_limit_are_a_compile_rejection():
    from gpu_worker.harness import shared_over_limit

    ks = [{"name": "prep", "shared": 131072}, {"name": "state", "shared": 241664}]
    assert shared_over_limit(ks, None) is None            # no CUDA: no limit known
    assert shared_over_limit(ks, 241664) is None          # exactly the limit fits
    msg = shared_over_limit(ks, 232448)                   # the H200's opt-in limit
    assert msg.startswith("compile-error: OutOfResources: state needs 241664 bytes") and "232448" in msg
    assert shared_over_limit([{"name": "x"}], 232448) is None  # unknown need: let the launch decide


def test_warming_runs_beside_the_worker_and_a_failure_leaves_the_problem_cold(capsys):
    from gpu_worker.harness import Evaluator
    from gpu_worker.scheduling import Scheduler
    from gpu_worker.worker import warm_in_background

    ev = Evaluator(interpreter=True, scheduler=Scheduler(spares=0))
    try:
        t = warm_in_background(ev, [("softmax", None), ("softmax", "no such shape")])
        t.join(300)
        assert not t.is_alive()
        out = capsys.readouterr().out
        assert "warm softmax:" in out and " oracles in " in out  # the bank is made
        # ... and where its time went: per part, and summed per case by the reference child
        for part in ("'reference-child'", "'ceilings'", "'oracles'", "'oracles.inputs'", "'oracles.oracle'",
                     "'oracles.baseline'", "'timing-sets'"):
            assert part in out
        assert ev._ref_meta  # ... and kept for the verifications to come
        assert "warm softmax failed" in out and "no such shape" in out  # printed, not raised
    finally:
        ev.close()


def test_shared_calls_run_each_request_once_and_never_keep_a_failure():
    # A workflow run that continues as new asks again for the evaluations it had in flight (same requests):
    # the second caller joins the work under way, or gets the result just finished; a failure is not kept
    import threading

    from gpu_worker.activities import SharedCalls

    calls = SharedCalls(keep_s=60)
    release = threading.Event()
    ran = []

    def work():
        ran.append(1)
        release.wait(30)
        return "report"

    first, how1 = calls.submit("compile:a", work)
    second, how2 = calls.submit("compile:a", work)  # while the first runs
    assert second is first and not first.done() and (how1, how2) == ("ran", "joined")
    release.set()
    assert first.result(30) == "report" and second.result(30) == "report"
    third, how3 = calls.submit("compile:a", work)  # finished: the kept result
    assert third.result(30) == "report" and how3 == "kept"
    assert len(ran) == 1 and calls.counts == {"ran": 1, "joined": 1, "kept": 1}
    assert calls.submit("compile:b", work)[0].result(30) == "report" and len(ran) == 2  # another request

    def broken():
        ran.append(1)
        raise RuntimeError("reference process died")

    import pytest

    with pytest.raises(RuntimeError, match="died"):
        calls.submit("verify:a", broken)[0].result(30)
    with pytest.raises(RuntimeError, match="died"):
        calls.submit("verify:a", broken)[0].result(30)  # ran again, not kept
    assert len(ran) == 4

    old = SharedCalls(keep_s=0.0)  # kept results expire
    old.submit("k", lambda: 1)[0].result(30)
    old.submit("k", lambda: 2)
    assert old.counts["ran"] == 2


def test_request_key_is_the_whole_request():
    from gpu_worker.activities import request_key
    from workflows.contracts import BenchRequest, BestRef, EvalRequest

    ev = EvalRequest(problem="kda", candidate_id="c1", source_key="s1", iteration=7)
    assert request_key("verify", ev) == request_key("verify", EvalRequest.model_validate_json(ev.model_dump_json()))
    assert request_key("verify", ev) != request_key("compile", ev)
    assert request_key("verify", ev) != request_key("verify", ev.model_copy(update={"iteration": 8}))
    best = BestRef(candidate_id="b", source_key="sb", speedup=1.1, time_ms=1.0, baseline_ms=1.1, iteration=3)
    b1 = BenchRequest(**ev.model_dump(), best=best)
    assert request_key("benchmark", b1) != request_key("benchmark", BenchRequest(**ev.model_dump()))
    assert request_key("benchmark", b1) != request_key("benchmark", b1.model_copy(update={"fresh_process": True}))
