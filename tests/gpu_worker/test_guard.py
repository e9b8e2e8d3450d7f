"""Library kernels and torch compute refused (gpu_worker.guard): by the static rules before anything runs,
and by the run-time guard alone (static rules off, `judge_raw`) for what the rules cannot see; forbidden
imports, processes, sockets, writes and timer patching likewise."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu_worker.harnesses import kernel, req
from workflows.contracts import BenchRequest


def test_static_rules_reject_library_softmax(ev, store):
    v = ev.verify(req(store, kernel("rt_library")))
    assert not v.ok and v.stage == "rules" and v.reason.startswith("library-kernel")
    b = ev.benchmark(BenchRequest(problem="softmax", candidate_id="lib", source_key=store.put_text(kernel("rt_library"))))
    assert not b.ok and b.stage == "rules"


@pytest.mark.parametrize("name,rule", [
    ("rt_library", "library-kernel"),        # torch.softmax reaches aten::_softmax under the dispatch guard
    ("torch_only_softmax", "library-kernel"),  # exp, amax, sum: none of them on the dispatch allowlist
    ("composed_softmax", "library-kernel"),    # torch.exp in run() beside a Triton kernel
    ("rt_importlib", "forbidden-import"),   # importlib.import_module("baselines...")
    ("rt_subprocess", "process"),
    ("rt_socket", "network"),
    ("rt_write", "filesystem"),
    ("rt_timer", "timer"),                  # time.perf_counter replaced at import
])
def test_runtime_guard(judge_raw, store, name, rule):
    v = judge_raw.verify(req(store, kernel(name)))
    assert not v.ok
    assert v.stage == "rules", v
    assert v.reason.startswith(rule), v.reason
    assert "run-time guard" in v.reason
    assert not Path("/tmp/marathon-escape.txt").exists()


def test_torch_compute_the_static_rules_cannot_see_is_refused_at_run_time(judge, store):
    # operators on tensors (x ** y, a / b) name no torch op: the dispatch allowlist refuses the first one
    v = judge.verify(req(store, kernel("hidden_torch_softmax")))
    assert not v.ok and v.stage == "rules", v
    assert v.reason.startswith("library-kernel") and "aten::" in v.reason and "run-time guard" in v.reason, v.reason
