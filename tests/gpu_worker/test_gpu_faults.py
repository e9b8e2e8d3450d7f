"""GPU faults inside candidates, marked `gpu`: an illegal memory access, a device-side hang, device
out-of-memory and a host segfault each become a rejection with its reason, and the same Evaluator then
still verifies an honest kernel. Run on a CUDA host with `pytest -m gpu tests/gpu_worker`."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

KERNELS = Path(__file__).parent / "kernels"


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    from workflows.artifacts import ArtifactStore
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler

    # static rules off: the faults must be contained at run time (rt_crash imports os, which the rules refuse)
    e = Evaluator(store=ArtifactStore(tmp_path_factory.mktemp("art")), interpreter=False, scheduler=Scheduler(spares=1),
                  static_rules=False, timeouts={"verify": 45, "load": 120})
    yield e
    e.close()


def _verify(ev, source: str):
    from workflows.contracts import EvalRequest

    cid = hashlib.sha256(source.encode()).hexdigest()[:16]
    return ev.verify(EvalRequest(problem="softmax", candidate_id=cid, source_key=ev.store.put_text(source)))


@pytest.mark.parametrize("name,stage,words", [
    ("gpu_illegal_address", "sandbox", ("cuda-error", "illegal memory access")),
    ("gpu_hang", "sandbox", ("timeout",)),
    ("gpu_oom", "sandbox", ("oom",)),
    ("rt_crash", "sandbox", ("crash", "SIGSEGV")),
])
def test_gpu_fault_is_a_rejection_with_its_reason(ev, name, stage, words):
    v = _verify(ev, (KERNELS / f"{name}.py").read_text())
    assert not v.ok and v.stage == stage, v
    for w in words:
        assert w in v.reason, v.reason


def test_still_serving_after_gpu_faults(ev):
    from gpu_worker.canaries import canary_source

    v = _verify(ev, canary_source("fast"))
    assert v.ok, v.reason
