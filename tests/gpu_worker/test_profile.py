"""The profile's ncu pass: the process it profiles finds the worker's packages, and a run with no metrics says
what ncu and that process said."""

from __future__ import annotations

import os
import types

from gpu_worker import profile
from gpu_worker.sandbox import REPO
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
    ev = types.SimpleNamespace(settings=GpuWorkerSettings(gpu_workdir=str(tmp_path / "work")), cuda=False,
                               children=types.SimpleNamespace(renders=None))
    req = EvalRequest(problem="softmax", candidate_id="c" * 16, source_key="k")
    text, bound, err = profile._ncu(ev, req, "def run(inputs, out):\n    pass\n", ["k"], None)
    assert bound == "unknown" and "==PROF== Connected" in text
    assert err == ("ncu produced no metrics (status 1): ==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                   "permission to access NVIDIA GPU Performance Counters")


def test_the_profiled_process_keeps_the_worker_s_python_path_and_its_failure_is_reported(tmp_path, monkeypatch):
    """A host whose packages are on PYTHONPATH: the process ncu runs keeps those entries after the
    repository's; where it fails, its last lines come with ncu's."""
    seen = tmp_path / "pythonpath"
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s' \"$PYTHONPATH\" > {seen}\n"
                    "echo 'Traceback (most recent call last):'\necho \"ModuleNotFoundError: No module named 'x'\"\n"
                    "echo '==ERROR== The application returned an error code (1).'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", "/opt/site-extra")
    ev = types.SimpleNamespace(settings=GpuWorkerSettings(gpu_workdir=str(tmp_path / "work")), cuda=False,
                               children=types.SimpleNamespace(renders=None))
    req = EvalRequest(problem="softmax", candidate_id="c" * 16, source_key="k")
    _, _, err = profile._ncu(ev, req, "def run(inputs, out):\n    pass\n", ["k"], None)
    assert seen.read_text() == f"{REPO}{os.pathsep}/opt/site-extra"
    assert err == ("ncu produced no metrics (status 1): ==ERROR== The application returned an error code (1). | "
                   "the profiled process said: Traceback (most recent call last): | "
                   "ModuleNotFoundError: No module named 'x'")
