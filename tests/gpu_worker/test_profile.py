"""The profile's ncu pass says why it read no metrics: ncu's own error lines, with its exit status."""

from __future__ import annotations

import os
import types

from gpu_worker import profile
from gpu_worker.settings import GpuWorkerSettings
from workflows.contracts import EvalRequest


def test_ncu_without_metrics_says_what_ncu_said(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '==PROF== Connected to process 1'\n"
                    "echo '==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
                    "Performance Counters'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    ev = types.SimpleNamespace(settings=GpuWorkerSettings(gpu_workdir=str(tmp_path / "work")), cuda=False)
    req = EvalRequest(problem="softmax", candidate_id="c" * 16, source_key="k")
    text, bound, err = profile._ncu(ev, req, "def run(inputs, out):\n    pass\n", ["k"], None)
    assert bound == "unknown" and "==PROF== Connected" in text
    assert err == ("ncu produced no metrics (status 1): ==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                   "permission to access NVIDIA GPU Performance Counters")
