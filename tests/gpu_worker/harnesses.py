"""The cheat tests judge with two harnesses: the Triton interpreter's on every machine, and the GPU's where
CUDA is (that parameter is marked `gpu`), so every cheating family is held to the same rejection on both."""

from __future__ import annotations

import pytest


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
        from gpu_worker.scheduling import Scheduler

        e = Evaluator(store=store, interpreter=False, scheduler=Scheduler(spares=spares), **settings)
        try:
            yield e
        finally:
            e.close()

    return judge
