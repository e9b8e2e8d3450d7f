"""The cheat tests judge with two harnesses: the Triton interpreter's on every machine, and the GPU's where
CUDA is (that parameter is marked `gpu`), so every cheating family is held to the same rejection on both.
Also the requests the tests send: a candidate's source stored and named by its hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from workflows.contracts import EvalRequest

KERNELS = Path(__file__).parent / "kernels"


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no torch, no CUDA
        return False


KINDS = ["interpreter",
         pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs CUDA")])]


def on_both(cpu_fixture: str, spares: int, **settings):
    """A module-scoped fixture over KINDS: the module's interpreter evaluator (the fixture `cpu_fixture`),
    then an evaluator on the GPU with the same scheduler spares and Evaluator `settings`."""

    @pytest.fixture(scope="module", params=KINDS)
    def judge(request, store):
        if request.param == "interpreter":
            yield request.getfixturevalue(cpu_fixture)
            return
        from gpu_worker.harness import Evaluator
        from gpu_worker.device.scheduling import Scheduler

        e = Evaluator(store=store, interpreter=False, scheduler=Scheduler(spares=spares), **settings)
        try:
            yield e
        finally:
            e.close()

    return judge


def req(store, source: str, problem="softmax") -> EvalRequest:
    key = store.put_text(source)
    return EvalRequest(problem=problem, candidate_id=hashlib.sha256(source.encode()).hexdigest()[:16], source_key=key)


def kernel(name: str) -> str:
    """A test kernel's source (tests/gpu_worker/kernels)."""
    return (KERNELS / f"{name}.py").read_text()


def canary(name: str) -> str:
    from gpu_worker.canaries import canary_source

    return canary_source(name)
