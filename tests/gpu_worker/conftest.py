"""The gpu_worker tests' shared harnesses, one of each per test module: an artifact store, the interpreter's
evaluator with the static rules on (`ev`) and off (`ev_raw`, to prove the run-time guard and the OS wall
alone), and the cheat tests' `judge`/`judge_raw`: those settings on the interpreter and, where CUDA is, on
the GPU. Each evaluator's timeouts are the largest any module's candidates need: a timeout bounds only a
candidate that hangs."""

from __future__ import annotations

import pytest

from tests.gpu_worker.harnesses import on_both

EV = {"spares": 2, "timeouts": {"verify": 60, "compile": 60}}
EV_RAW = {"spares": 1, "static_rules": False, "timeouts": {"verify": 40, "compile": 40}}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A module's artifact store, also the one its sandbox children and CLI calls find (MARATHON_ARTIFACTS)."""
    from workflows.artifacts import ArtifactStore

    root = tmp_path_factory.mktemp("artifacts")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MARATHON_ARTIFACTS", str(root))
        yield ArtifactStore(root)


def _evaluator(store, spares: int, **settings):
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler

    return Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=spares), **settings)


@pytest.fixture(scope="module")
def ev(store):
    e = _evaluator(store, **EV)
    yield e
    e.close()


@pytest.fixture(scope="module")
def ev_raw(store):
    """Static rules off: proves the run-time guard and the OS wall on their own."""
    e = _evaluator(store, **EV_RAW)
    yield e
    e.close()


judge = on_both("ev", **EV)
judge_raw = on_both("ev_raw", **EV_RAW)
