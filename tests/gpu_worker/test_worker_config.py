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
    from gpu_worker.harness.compile import shared_over_limit
    from gpu_worker.protocol import CompiledKernel

    ks = [CompiledKernel(name="prep", shared=131072), CompiledKernel(name="state", shared=241664)]
    assert shared_over_limit(ks, None) is None            # no CUDA: no limit known
    assert shared_over_limit(ks, 241664) is None          # exactly the limit fits
    msg = shared_over_limit(ks, 232448)                   # the H200's opt-in limit
    assert msg.startswith("compile-error: OutOfResources: state needs 241664 bytes") and "232448" in msg
    assert shared_over_limit([CompiledKernel(name="x")], 232448) is None  # unknown need: let the launch decide


def test_warming_runs_beside_the_worker_and_a_failure_leaves_the_problem_cold(capsys):
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler
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
        assert ev.refs.meta  # ... and kept for the verifications to come
        assert "warm softmax failed" in out and "no such shape" in out  # printed, not raised
    finally:
        ev.close()


def test_the_other_listed_shapes_are_warmed_cheapest_first_and_the_next_ones_child_kept():
    from baselines.registry import get_problem
    from gpu_worker.harness.cases import other_shapes
    from gpu_worker.worker import other_listed_shapes

    kda = get_problem("kda")
    primary = kda.shapes[0]
    others, keep = other_listed_shapes("kda", primary.name)
    assert others == other_shapes(kda, primary) and primary.name not in others
    assert set(others) == {s.name for s in kda.shapes[1:]} and keep == others[0]
