"""A synthetic GPU evaluator for orchestration tests and the overhead benchmark: the same activity
names and contracts as gpu_worker, no kernels run. Its "time" is a deterministic function of the
knobs, so the search policy has a real landscape to climb; some knob settings fail verification."""

from __future__ import annotations

import time

from temporalio import activity

from workflows.contracts import (BenchReport, BenchRequest, CompileReport, EvalRequest, ProfileReport,
                                 Receipt, VerifyReport)

DELAY_S = 0.0  # raised by tests that need an activity to be in flight when something is killed
REQUESTS: list[tuple[str, str, str]] = []  # (activity, workflow run id, request JSON) of every GPU call
SLOW_EVERY, SLOW_S = 0, 0.0  # iterations 1, 1 + SLOW_EVERY, ... take SLOW_S longer to compile
WORKER_QUEUE: str | None = None  # the GPU worker's own queue, named in compile reports (tests.workflows.helpers)
INTERPRETER = True  # False: the reports read as a GPU's (a run then asks for what only timed kernels get)


def synthetic_ms(source: str) -> float:
    # A landscape over softmax's knobs: bigger blocks and more warps help, up to a point.
    k = _knobs(source)
    t = 1.0
    t *= {64: 1.6, 128: 1.3, 256: 1.0, 512: 0.85, 1024: 0.8, 2048: 0.9}.get(k.get("BLOCK_N"), 1.0)
    t *= {1: 1.4, 2: 1.1, 4: 1.0, 8: 0.95}.get(k.get("num_warps"), 1.0)
    t *= 0.9 if k.get("VARIANT") == "single" else 1.0
    t *= {1: 1.0, 2: 0.97, 4: 1.02}.get(k.get("ROWS"), 1.0)
    return t


def _fails(source: str) -> bool:
    # About 1 in 7 knob settings "fail verification", chosen by knob values (not by a hash of the source, so
    # an edit to the template's text cannot move the failures onto kernels a test relies on).
    k = _knobs(source)
    return (k.get("EVICT") == "evict_first" and k.get("ROWS") == 8) or \
        (k.get("num_stages") == 4 and k.get("num_warps") == 1)


def _knobs(source: str) -> dict:
    import ast
    import re

    m = re.search(r"^KNOBS = (\{.*\})$", source, re.M)
    return ast.literal_eval(m.group(1)) if m else {}


def _source(key: str) -> str:
    from workflows.artifacts import ArtifactStore

    return ArtifactStore().get_text(key)


@activity.defn(name="compile_candidate")
def compile_candidate(req: EvalRequest) -> CompileReport:
    _note("compile_candidate", req)
    if DELAY_S:
        _sleep_heartbeating(DELAY_S)
    if SLOW_EVERY and req.iteration is not None and req.iteration % SLOW_EVERY == 1:
        _sleep_heartbeating(SLOW_S)
    return CompileReport(ok=True, interpreter=INTERPRETER, worker_queue=WORKER_QUEUE)


@activity.defn(name="verify_candidate")
def verify_candidate(req: EvalRequest) -> VerifyReport:
    _note("verify_candidate", req)
    if _fails(_source(req.source_key)):
        return VerifyReport(ok=False, reason="synthetic: rel err 0.3 > threshold 1e-5", rel_err=0.3,
                            interpreter=INTERPRETER)
    return VerifyReport(ok=True, rel_err=1e-7, threshold=1e-5, interpreter=INTERPRETER)


@activity.defn(name="benchmark_candidate")
def benchmark_candidate(req: BenchRequest) -> BenchReport:
    _note("benchmark_candidate", req)
    if DELAY_S:
        _sleep_heartbeating(DELAY_S)
    t = synthetic_ms(_source(req.source_key))
    s = 1.0 / t
    return BenchReport(ok=True, time_ms=t, baseline_ms=1.0, baseline_name="synthetic", speedup=s,
                       speedup_ci=(s * 0.99, s * 1.01), interpreter=INTERPRETER, gpu_seconds=0.01,
                       receipt=Receipt(device="synthetic", mode="interpreter" if INTERPRETER else "cuda-graph"))


@activity.defn(name="profile_candidate")
def profile_candidate(req: EvalRequest) -> ProfileReport:
    return ProfileReport(ok=True, summary="synthetic", tool="none")


def _note(name: str, req) -> None:
    try:
        run = activity.info().workflow_run_id
    except RuntimeError:  # called directly (tests/bench_overhead.py)
        return
    REQUESTS.append((name, run, req.model_dump_json()))


def _sleep_heartbeating(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        activity.heartbeat()
        time.sleep(0.1)


SYNTHETIC_GPU_ACTIVITIES = [compile_candidate, verify_candidate, benchmark_candidate, profile_candidate]
