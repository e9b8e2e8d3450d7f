"""GPU tests of the harness (marked `gpu`, skipped without CUDA): `pytest -m gpu tests/gpu_worker` on a
CUDA host; scripts/gpu_harness.py runs the same checks and prints their figures."""

from __future__ import annotations

import hashlib

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    from activities.artifacts import ArtifactStore
    from gpu_worker.harness import Evaluator

    e = Evaluator(store=ArtifactStore(tmp_path_factory.mktemp("art")), interpreter=False, spares=1)
    yield e
    e.close()


def test_selftest_ranks_and_classifies(ev):
    r = ev.selftest()
    assert r["ok"], r
    assert not r["interpreter"]
    f, s = r["canaries"]["fast"], r["canaries"]["slow"]
    assert f["ci"][0] > s["ci"][1]


def test_benchmark_receipt_and_crosscheck(ev):
    from gpu_worker.canaries import canary_source
    from workflows.contracts import BenchRequest

    src = canary_source("fast")
    key = ev.store.put_text(src)
    b = ev.benchmark(BenchRequest(problem="softmax", candidate_id=hashlib.sha256(src.encode()).hexdigest()[:16],
                                  source_key=key, fresh_process=True))
    assert b.ok, b.reason
    assert b.receipt.device and b.receipt.driver and b.receipt.mode in ("eager", "cuda-graph")
    assert b.receipt.repetitions >= 50
    assert "profiler cross-check" in ev.store.get_text(b.log_key)


def test_compile_report_has_compiler_stats(ev):
    from baselines.registry import get_problem
    from workflows.contracts import EvalRequest

    src = get_problem("softmax").template()
    c = ev.compile(EvalRequest(problem="softmax", candidate_id="tmpl", source_key=ev.store.put_text(src)))
    assert c.ok and c.registers and c.num_warps and c.spills is not None and not c.interpreter
