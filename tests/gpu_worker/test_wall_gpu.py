"""The OS wall on a CUDA host (marked `gpu`, skipped without CUDA): a candidate child's kernels compile
lazily behind it (Triton runs ptxas at a kernel's first launch). The cheats' refusals on CUDA are the cheat
tests' own (their `judge`/`judge_raw` harnesses, tests/gpu_worker/conftest.py)."""

from __future__ import annotations

import hashlib
import os

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    from workflows.artifacts import ArtifactStore
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler

    e = Evaluator(store=ArtifactStore(tmp_path_factory.mktemp("art")), interpreter=False, scheduler=Scheduler(spares=1),
                  static_rules=False)
    yield e
    e.close()


def req(ev, source: str):
    from workflows.contracts import EvalRequest

    return EvalRequest(problem="softmax", candidate_id=hashlib.sha256(source.encode()).hexdigest()[:16],
                       source_key=ev.store.put_text(source))


def test_the_load_reply_lists_ptxas_and_honest_kernels_compile_behind_the_wall(ev):
    from baselines.registry import get_problem
    from gpu_worker import wall
    from gpu_worker.protocol import CudaInit, Load
    from gpu_worker.sandbox import Sandbox

    sb = Sandbox("candidate", interpreter=False)
    try:
        assert sb.call(CudaInit(), 120).ok
        r = sb.call(Load(source=get_problem("softmax").template(), problem="softmax", shape=None), 120)
        assert r.ok and not r.violations, r
        w = r.result.wall
        assert w["os"] == "on" and w["network"].startswith("seccomp")
        if wall.landlock_abi():
            assert any(os.path.basename(p).startswith("ptxas") for p in w["exec"]), w
    finally:
        sb.close()
    template = get_problem("softmax").template()
    c = ev.compile(req(ev, template))
    assert c.ok, c.error
    v = ev.verify(req(ev, template))
    assert v.ok, v.reason
