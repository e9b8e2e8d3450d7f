"""Problem files on a GPU (marked `gpu`, skipped without CUDA): the RMSNorm and softmax files of
tests/baselines/files at their get_inputs() size, their Triton candidates verified against the float64
oracle and timed against the eager reference by the real harness."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

FILES = Path(__file__).parent / "files"


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    from workflows.artifacts import ArtifactStore
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler

    root = tmp_path_factory.mktemp("art")
    old = os.environ.get("MARATHON_ARTIFACTS")
    os.environ["MARATHON_ARTIFACTS"] = str(root)
    e = Evaluator(store=ArtifactStore(root), interpreter=False, scheduler=Scheduler(spares=1))
    yield e
    e.close()
    if old is None:
        os.environ.pop("MARATHON_ARTIFACTS", None)
    else:
        os.environ["MARATHON_ARTIFACTS"] = old


@pytest.mark.parametrize("name", ["rmsnorm", "softmax"])
def test_file_problem_candidate_verifies_and_benchmarks_on_the_gpu(ev, name):
    from workflows.contracts import EvalRequest

    key = "file:" + ev.store.put_bytes((FILES / f"{name}.py").read_bytes())
    src = (FILES / f"{name}_kernel.py").read_text()
    r = EvalRequest(problem=key, candidate_id=hashlib.sha256(src.encode()).hexdigest()[:16],
                    source_key=ev.store.put_text(src))
    assert ev.compile(r).ok
    v = ev.verify(r)
    assert v.ok and not v.interpreter, v.reason
    b = ev.benchmark(r.bench())
    assert b.ok, b.reason
    assert b.baseline_name == "eager" and b.time_ms > 0 and b.baseline_ms > 0


def test_a_kernel_ignoring_the_models_affine_parameters_is_rejected_on_the_gpu(ev):
    """LayerNorm's weight and bias are drawn per case at the file's GPU size too: a kernel that leaves
    either out (right only for nn.LayerNorm's starting weight 1 and bias 0) fails verification."""
    from workflows.contracts import EvalRequest

    key = "file:" + ev.store.put_bytes((FILES / "layernorm.py").read_bytes())
    good = (FILES / "layernorm_kernel.py").read_text()

    def request(src: str) -> EvalRequest:
        return EvalRequest(problem=key, candidate_id=hashlib.sha256(src.encode()).hexdigest()[:16],
                           source_key=ev.store.put_text(src))

    v = ev.verify(request(good))
    assert v.ok and not v.interpreter, v.reason
    for plain in ("d * r * w", "d * r + b", "d * r"):
        w = ev.verify(request(good.replace("d * r * w + b", plain)))
        assert not w.ok and w.stage == "verify" and w.reason.startswith("wrong"), (plain, w.reason)
