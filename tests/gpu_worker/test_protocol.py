"""The whole evaluation protocol on CPU: Triton interpreter, CPU torch, real sandbox processes.

Every cheating family has a kernel that must be rejected with the right reason; honest variants pass;
sandbox failures (hang, crash, exception, memory, forbidden import via importlib, subprocess, socket,
writes outside the temp dir, timer patching) are contained and the evaluator keeps serving. The cheat tests
judge with `judge`/`judge_raw`: these settings on the interpreter and, where CUDA is, on the GPU too.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gpu_worker.protocol import CudaInit, Reply, WarmTriton
from tests.gpu_worker.harnesses import on_both
from workflows.contracts import BenchRequest, BestRef, EvalRequest

KERNELS = Path(__file__).parent / "kernels"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from workflows.artifacts import ArtifactStore

    root = tmp_path_factory.mktemp("artifacts")
    os.environ["MARATHON_ARTIFACTS"] = str(root)
    return ArtifactStore(root)


@pytest.fixture(scope="module")
def ev(store):
    from gpu_worker.harness import Evaluator
    from gpu_worker.scheduling import Scheduler

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=2), timeouts={"verify": 40, "compile": 60})
    yield e
    e.close()


@pytest.fixture(scope="module")
def ev_raw(store):
    """Static rules off: proves the run-time guard on its own."""
    from gpu_worker.harness import Evaluator
    from gpu_worker.scheduling import Scheduler

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=1), static_rules=False, timeouts={"verify": 25, "compile": 25})
    yield e
    e.close()


#: the cheat tests' harnesses: ev's and ev_raw's settings on the interpreter and, where CUDA is, on the GPU
judge = on_both("ev", spares=2, timeouts={"verify": 40, "compile": 60})
judge_raw = on_both("ev_raw", spares=1, static_rules=False, timeouts={"verify": 25, "compile": 25})


def req(store, source: str, problem="softmax") -> EvalRequest:
    key = store.put_text(source)
    return EvalRequest(problem=problem, candidate_id=hashlib.sha256(source.encode()).hexdigest()[:16], source_key=key)


def kernel(name: str) -> str:
    return (KERNELS / f"{name}.py").read_text()


def canary(name: str) -> str:
    from gpu_worker.canaries import canary_source

    return canary_source(name)


# --- honest kernels ------------------------------------------------------------------------------

def test_template_compiles_verifies_and_benchmarks(ev, store):
    from baselines.registry import get_problem

    r = req(store, get_problem("softmax").template())
    c = ev.compile(r)
    assert c.ok and c.interpreter and set(c.kernels) == {"_softmax_online", "_softmax_single"}
    v = ev.verify(r)
    assert v.ok, v.reason
    assert v.interpreter and v.rel_err < v.threshold and v.threshold >= 1e-5
    assert v.baseline_rel_err is not None and v.log_key and "seed" in store.get_text(v.log_key)
    best = BestRef(candidate_id="x", source_key=store.put_text(canary("fast")), speedup=1.0, time_ms=1.0,
                   baseline_ms=1.0, iteration=1, interpreter=True)
    b = ev.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key,
                                  best=best, fresh_process=True))
    assert b.ok, b.reason
    assert b.interpreter and b.receipt.mode == "interpreter" and b.receipt.repetitions >= 4
    assert b.time_ms > 0 and b.baseline_ms > 0 and b.best_time_ms > 0
    # the head-to-head with the best, same session, names the best it was measured against
    assert b.vs_best == "x" and 0 < b.vs_best_ci[0] <= b.vs_best_ci[1]
    assert b.baseline_name == "torch.softmax"
    lo, hi = b.speedup_ci
    assert lo <= b.speedup * 1.0001 and hi >= b.speedup * 0.9999
    log = store.get_text(b.log_key)
    assert "physical floor: not checked" in log and "profiler cross-check: skipped" in log


@pytest.mark.parametrize("name", ["slow", "fast"])
def test_honest_canaries_pass(ev, store, name):
    v = ev.verify(req(store, canary(name)))
    assert v.ok, v.reason


def test_named_shape_and_unknown_shape(ev, store):
    r = req(store, canary("fast"))
    v = ev.verify(r.model_copy(update={"shape": "M64 N300"}))
    assert v.ok, v.reason
    v = ev.verify(r.model_copy(update={"shape": "nonexistent"}))
    assert not v.ok and "no shape" in v.reason


# --- cheating families: each rejected with the right reason ---------------------------------------

@pytest.mark.parametrize("source,stage,reason", [
    ("canary:wrong", "verify", ("wrong", "non-finite")),               # precision/overflow: wide inputs
    ("canary:cheat", "verify", ("input-mutation",)),                   # family 2: mutates inputs
    ("unwritten", "verify", ("non-finite",)),                          # family 11: skipped elements (NaN poison)
    ("shape_cache", "verify", ("wrong", "output-cache", "non-finite", "degenerate")),  # family 6/10: cached
    # result replayed; on a GPU the first result it caches is the compile's (Triton's warmup path runs no
    # kernel, so it caches unwritten memory: NaN, zeros or garbage, whatever the allocator handed out)
    ("zeros", "verify", ("wrong", "degenerate")),                      # family 9: zero output
    ("nondeterministic", "verify", ("nondeterministic", "wrong")),     # family 11: differs on rerun, or on
                                                                         # a compared case
])
def test_cheating_families_rejected(judge, store, source, stage, reason):
    text = canary(source.split(":")[1]) if source.startswith("canary:") else kernel(source)
    v = judge.verify(req(store, text))
    assert not v.ok
    assert v.stage == stage, v
    assert v.reason.startswith(reason), v.reason
    assert v.log_key is not None


def test_static_rules_reject_library_softmax(ev, store):
    v = ev.verify(req(store, kernel("rt_library")))
    assert not v.ok and v.stage == "rules" and v.reason.startswith("library-kernel")
    b = ev.benchmark(BenchRequest(problem="softmax", candidate_id="lib", source_key=store.put_text(kernel("rt_library"))))
    assert not b.ok and b.stage == "rules"


def test_compile_error_returned_verbatim(ev, store):
    c = ev.compile(req(store, kernel("syntax_error_kernel")))
    assert not c.ok
    assert "arange" in c.error or "constexpr" in c.error, c.error
    assert c.log_key


# --- run-time guard, static rules off -------------------------------------------------------------

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


@pytest.mark.parametrize("name,stage,words", [
    ("rt_hang", "sandbox", ("timeout",)),
    ("rt_crash", "sandbox", ("crash", "SIGSEGV")),
    ("rt_exception", "verify", ("exception", "blew up on purpose")),
])
def test_sandbox_failures_contained(judge_raw, store, name, stage, words):
    v = judge_raw.verify(req(store, kernel(name)))
    assert not v.ok and v.stage == stage, v
    for w in words:
        assert w in v.reason, v.reason


def test_memory_limit_contained(store):
    from gpu_worker.harness import Evaluator
    from gpu_worker.scheduling import Scheduler
    from gpu_worker.settings import GpuWorkerSettings

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0), static_rules=False,
                  timeouts={"verify": 60}, settings=GpuWorkerSettings(sandbox_mem_gb=3))
    try:
        v = e.verify(req(store, kernel("rt_memory")))
    finally:
        e.close()
    assert not v.ok
    assert ("oom" in v.reason or "memory" in v.reason), v.reason


def test_still_serving_after_failures(ev_raw, store):
    v = ev_raw.verify(req(store, canary("fast")))
    assert v.ok, v.reason


# --- activities, Temporal side --------------------------------------------------------------------

def test_activities_in_activity_environment(ev, store):
    from temporalio.testing import ActivityEnvironment

    from gpu_worker import activities as acts

    acts.set_evaluator(ev)
    env = ActivityEnvironment()
    r = req(store, canary("fast"))
    c = env.run(acts.compile_candidate, r)
    assert c.ok
    v = env.run(acts.verify_candidate, r)
    assert v.ok and v.interpreter
    bad = env.run(acts.verify_candidate, req(store, canary("wrong")))
    assert not bad.ok and bad.stage == "verify"


def test_artifact_store_failure_is_non_retryable(ev, store, monkeypatch):
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    from workflows.artifacts import ArtifactStoreError
    from gpu_worker import activities as acts

    acts.set_evaluator(ev)
    r = req(store, canary("wrong"))

    def broken(data):
        raise ArtifactStoreError("artifact store /x is not writable: read-only file system")

    monkeypatch.setattr(store, "put_bytes", broken)
    with pytest.raises(ApplicationError) as ei:
        ActivityEnvironment().run(acts.verify_candidate, r)
    assert ei.value.non_retryable and "not writable" in str(ei.value)


def test_selftest_canaries_and_refusal(ev):
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    from gpu_worker import activities as acts

    acts.set_evaluator(ev)
    res = ActivityEnvironment().run(acts.gpu_selftest)
    assert res["ok"], res
    assert res["canaries"]["slow"]["verify_ok"] and res["canaries"]["fast"]["verify_ok"]
    assert not res["canaries"]["wrong"]["verify_ok"] and not res["canaries"]["cheat"]["verify_ok"]
    # a failed self-test makes the worker refuse work
    ev.selftest_result = {"ok": False, "problems": ["the wrong canary passed verification"]}
    try:
        with pytest.raises(ApplicationError) as ei:
            ActivityEnvironment().run(acts.compile_candidate, EvalRequest(problem="softmax", candidate_id="c",
                                                                          source_key="0" * 64))
        assert ei.value.non_retryable and "self-test failed" in str(ei.value)
    finally:
        ev.selftest_result = res


def test_worker_builds(ev):
    from gpu_worker import activities as acts
    from gpu_worker.worker import gpu_activities

    names = [f.__temporal_activity_definition.name for f in gpu_activities()]
    assert names == ["compile_candidate", "verify_candidate", "benchmark_candidate", "profile_candidate", "gpu_selftest"]
    acts.set_evaluator(ev)


def test_profile_interpreter(ev, store):
    p = ev.profile(req(store, canary("fast")))
    assert p.ok and "interpreter" in p.summary and p.bound == "unknown"


def test_warm_fills_oracle_bank(store):
    import gpu_worker.harness as h
    from gpu_worker.scheduling import Scheduler
    from gpu_worker.settings import GpuWorkerSettings

    e = h.Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0),
                    settings=GpuWorkerSettings(seed_pool=3))
    try:
        w = e.warm("softmax")
        assert w["oracles"] == 6 and len(e._ref_meta) == 6
        # a later verification needs no new oracle: every case hits the bank
        before = dict(e._ref_meta)
        v = e.verify(req(store, canary("fast")))
        assert v.ok and set(e._ref_meta) == set(before)
    finally:
        e.close()


def test_an_oracle_is_computed_once_when_two_callers_want_it(store):
    """Warm-up and an early verification may ask for the same case at once; the one that waited for the
    reference child finds the other's entry (with its timings) and computes nothing again."""
    import contextlib
    import threading

    from gpu_worker.harness import Evaluator
    from gpu_worker.protocol import ReferenceCase, References, Reply, Staged
    from gpu_worker.scheduling import Scheduler

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    try:
        p = e._problem("softmax")
        sh = e._shape(p, None)
        case = (p.distributions[0], 0)
        other = (p.distributions[0], 1)  # not computed by anyone yet: computed below, once
        first = ReferenceCase(dist=case[0], seed=0, hash="h", baseline_err=1e-7, timing={"oracle": 20.0})
        calls = []

        class Child:
            def call(self, request, timeout, hb=None):
                calls.append(request.cmd)
                if request.cmd == "stage":
                    return Reply(seq=None, result=Staged(seconds=0.0))
                return Reply(seq=None, result=References(cases=[ReferenceCase(
                    dist=other[0], seed=1, hash="h", baseline_err=1e-7, timing={"oracle": 0.0})]))

        @contextlib.contextmanager
        def racing_lock(lock, timing=False):
            # the other caller finished its computation of the case while this one waited for the child
            e._ref_meta[(p.name, sh.name, *case)] = first
            yield

        e._ref = lambda problem, shape, hb: (Child(), threading.Lock(), {})
        e._with_ref = racing_lock
        assert e.reference(p, sh, [case], None) == [first]
        assert "reference" not in calls  # (its inputs were staged, host work before the device turn)
        calls.clear()
        assert e.reference(p, sh, [case, other], None)[0] == first and calls == ["stage", "reference"]
    finally:
        e.close()


def test_verification_reports_where_its_time_went(ev, store):
    # the activity wrapper logs these phases with every GPU activity (scripts/phase_summary.py reads them)
    from gpu_worker.harness import phases_begin, phases_end

    phases_begin()
    v = ev.verify(req(store, canary("fast")))
    ph = phases_end()
    assert v.ok, v.reason
    assert "load" in ph or ph.get("handed-on") == 1, ph  # loaded here, or by an earlier compile of it
    for name in ("prepare", "reference", "run-cases", "run-cases.first-call", "run-cases.export",
                 "export", "compare", "compare.import", "compare.oracle-and-math"):
        assert name in ph and ph[name] >= 0, (name, ph)
    assert ph["run-cases"] >= ph["run-cases.first-call"]
    assert phases_end() == {}  # collected once


def test_input_bank_written_by_reference_read_by_candidates(store, tmp_path):
    """The reference child leaves each case's inputs in the bank (read-only); candidate children read
    them there. The reference never reads the bank, so an altered bank file is caught by the fingerprint."""
    import torch

    import gpu_worker.harness as h
    from gpu_worker.scheduling import Scheduler
    from baselines.registry import get_problem

    from gpu_worker.settings import GpuWorkerSettings

    e = h.Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0),
                    settings=GpuWorkerSettings(gpu_workdir=tmp_path, seed_pool=3))
    try:
        e.warm("softmax")
        bank = sorted((tmp_path / "input-bank").glob("*.pt"))
        # one file per pool case, plus each distribution's timing values the warm-up prepared
        dists = len(get_problem("softmax").distributions)
        assert len(bank) == 3 * dists + dists * e._plan()["pool"]
        assert all(p.stat().st_mode & 0o777 == 0o444 for p in bank)
        assert e.verify(req(store, canary("fast"))).ok
        for p in bank:
            p.chmod(0o644)
            x = torch.load(p, weights_only=True)
            name = next(k for k, v in x.items() if isinstance(v, torch.Tensor))
            x[name] = x[name] + 1
            torch.save(x, p)
        v = e.verify(req(store, canary("slow")))
        assert not v.ok and "inputs differ" in v.reason, v.reason
    finally:
        e.close()


def test_late_write_rejected(judge_raw, store):
    # outputs are snapshotted right after each call and the candidate's buffers must still match them
    # when the worker exports them: the zeros the call produced are what is judged, and the change is named
    v = judge_raw.verify(req(store, kernel("late_write")))
    assert not v.ok and v.stage == "verify", v
    assert v.reason.startswith("late-write"), v.reason


def test_child_handed_on_from_compile_to_verify_to_benchmark(store):
    from gpu_worker.harness import Evaluator, phases_begin, phases_end
    from gpu_worker.scheduling import Scheduler

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    try:
        r = req(store, canary("fast"))
        assert e.compile(r).ok and len(e.loaded) == 1
        phases_begin()
        v = e.verify(r)
        ph = phases_end()
        assert v.ok, v.reason
        assert ph.get("handed-on") == 1 and "load" not in ph, ph  # no second child, no second load
        assert len(e.loaded) == 1
        phases_begin()
        b = e.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))
        ph = phases_end()
        assert b.ok, b.reason
        # no best to beat: the candidate's child is kept, as the likely best of the next benchmark
        assert ph.get("handed-on") == 1 and len(e.loaded) == 1
        best = BestRef(candidate_id=r.candidate_id, source_key=r.source_key, speedup=b.speedup, time_ms=b.time_ms,
                       baseline_ms=b.baseline_ms, iteration=1, interpreter=True)
        slow = req(store, canary("slow"))
        phases_begin()
        b2 = e.benchmark(BenchRequest(problem="softmax", candidate_id=slow.candidate_id, source_key=slow.source_key,
                                      best=best))
        ph = phases_end()
        assert b2.ok, b2.reason
        assert ph.get("handed-on") == 1 and ph.get("load"), ph  # the best's child came loaded, the new one did not
        e.loaded.close()
        # a verification that fails closes its child instead of handing it on
        bad = req(store, kernel("zeros"))
        assert e.compile(bad).ok and len(e.loaded) == 1
        assert not e.verify(bad).ok and len(e.loaded) == 0
        # with nothing handed on (another worker compiled it), verification loads a fresh child
        phases_begin()
        assert e.verify(req(store, canary("slow"))).ok
        assert "load" in phases_end() and len(e.loaded) == 1
        e.loaded.close()
    finally:
        e.close()


def test_loaded_children_limit_and_age():
    from gpu_worker.scheduling import LoadedChildren

    class Child:  # what LoadedChildren uses of a Sandbox
        def __init__(self):
            self.closed = False

        def alive(self):
            return not self.closed

        def close(self):
            self.closed = True

    kept = LoadedChildren(limit=2, ttl=60)
    a, b, c = Child(), Child(), Child()
    kept.put("a", a)
    kept.put("b", b)
    kept.put("c", c)  # over the limit: the oldest is closed
    assert a.closed and not b.closed and len(kept) == 2
    assert kept.take("b") is b and kept.take("b") is None
    c.close()
    assert kept.take("c") is None  # a dead child is not handed on
    old = LoadedChildren(limit=4, ttl=0.0)
    d = Child()
    old.put("d", d)
    assert old.take("d") is None and d.closed  # too old
    kept.put("e", Child())
    kept.close()
    assert len(kept) == 0
    # several children of one candidate (the best, in overlapping benchmarks), at most per_key of them
    many = LoadedChildren(limit=8, ttl=60, per_key=2)
    x1, x2, x3 = Child(), Child(), Child()
    many.put("x", x1)
    many.put("x", x2)
    many.put("x", x3)  # a third copy: the oldest goes
    assert x1.closed and not x2.closed and not x3.closed and len(many) == 2
    got = {many.take("x"), many.take("x")}
    assert got == {x2, x3} and many.take("x") is None


def test_work_skipped_while_timed_is_rejected(judge, store):
    r = req(store, kernel("timed_skip"))
    assert judge.compile(r).ok
    assert judge.verify(r).ok  # right while it is checked
    b = judge.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))
    assert not b.ok and b.stage == "benchmark", b
    assert b.reason.startswith("timed-output"), b.reason


def test_work_skipped_on_some_timed_calls_is_rejected_by_their_fingerprints(judge, store):
    r = req(store, kernel("timed_skip_some"))
    assert judge.compile(r).ok
    assert judge.verify(r).ok  # right while it is checked
    b = judge.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))
    assert not b.ok and b.stage == "benchmark", b
    assert b.reason.startswith("timed-output: timed call ") and "'y' does not match" in b.reason, b.reason


def test_an_output_buffer_replaced_instead_of_written_is_rejected(judge, store):
    v = judge.verify(req(store, kernel("replaced_output")))
    assert not v.ok and v.reason.startswith("output-type: run must write into the tensors it is given"), v


def test_verified_at_a_random_shape_on_request(judge, store):
    from baselines.problem import RANDOM_SHAPE
    from baselines.registry import get_problem

    p = get_problem("softmax")
    listed = (p.cpu_shape if judge.interpreter else p.shapes[0]).name  # where it expects to be verified
    cheat = req(store, kernel("listed_shape_only"))
    assert judge.verify(cheat).ok  # right there
    v = judge.verify(cheat.model_copy(update={"random_shape": True}))
    assert not v.ok and v.family == "shape-specific", v
    assert v.reason.startswith(f"shape-specific: correct at {listed}, not at {RANDOM_SHAPE}M="), v.reason

    honest = judge.verify(req(store, p.template()).model_copy(update={"random_shape": True}))
    assert honest.ok and honest.random_shape and honest.random_shape.startswith(RANDOM_SHAPE), honest
    assert f"random shape {honest.random_shape}: worst rel_err" in store.get_text(honest.log_key)
    assert not any(k[1].startswith(RANDOM_SHAPE) for k in judge._refs), "a random shape's reference child stays"


def test_a_child_loaded_for_another_shape_compiles_outside_any_device_job(judge, store, monkeypatch):
    # a waiting timing block waits for the running jobs: a compiler inside one would keep it waiting for seconds
    import contextlib
    import threading

    from baselines.registry import get_problem
    from gpu_worker.sandbox import Sandbox

    held, calls = [], []  # held: the threads inside a device job (spares take theirs on threads of their own)
    real_job, real_call = judge._device_job, Sandbox.call

    @contextlib.contextmanager
    def job():
        with real_job():
            held.append(threading.get_ident())
            try:
                yield
            finally:
                held.remove(threading.get_ident())

    def call(sb, request, *a, **kw):
        calls.append((request.cmd, threading.get_ident() in held))
        return real_call(sb, request, *a, **kw)

    monkeypatch.setattr(judge, "_device_job", job)
    monkeypatch.setattr(Sandbox, "call", call)
    v = judge.verify(req(store, get_problem("softmax").template()).model_copy(update={"random_shape": True}))
    assert v.ok and v.random_shape, v
    compiles = [h for c, h in calls if c == "compile"]
    assert compiles and not any(compiles), calls  # the random shape's child compiled, with no turn
    assert all(h for c, h in calls if c in ("prepare", "verify_case")), calls


def test_honest_benchmark_reports_checked_timed_outputs(ev, store):
    r = req(store, canary("fast"))
    b = ev.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))
    assert b.ok, b.reason
    log = store.get_text(b.log_key)
    # one repetition's outputs checked per block, on each distribution
    assert "[normal] interpreter" in log and "[wide] interpreter" in log
    assert log.count("timed outputs 2 outputs") == 2, log
    assert log.count("6 timed calls fingerprinted, worst ") == 2, log  # every timed call: 2 blocks of 3


def test_sass_scan_reads_every_kernel(ev, tmp_path, monkeypatch):
    # cuobjdump stands in as a script here (no CUDA toolkit on CI); the scan runs one per kernel, side by side
    tool = tmp_path / "cuobjdump"
    tool.write_text('#!/bin/sh\ncase "$2" in *a.cubin) echo "  HGMMA.64x128x16.F32.BF16";; '
                    '*) echo "  UTMALDG.2D [UR4], [UR6]";; esac\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for n in ("a", "b"):
        (tmp_path / f"{n}.cubin").write_bytes(b"\0")
    from gpu_worker.sass import scan_sass

    out = scan_sass([{"name": "ka", "cubin_path": str(tmp_path / "a.cubin")},
                     {"name": "kb", "cubin_path": str(tmp_path / "b.cubin")},
                     {"name": "gone", "cubin_path": str(tmp_path / "missing.cubin")}])
    assert out["hgmma"] and out["tma"]
    assert "SASS ka: HGMMA=True TMA=False" in out["text"] and "SASS kb: HGMMA=False TMA=True" in out["text"]


















def _cores_setting(value: str):
    from gpu_worker.settings import GpuWorkerSettings

    return GpuWorkerSettings.from_env({"MARATHON_TIMING_CPUS": value}).timing_cpus


def test_timing_cpus_split():
    import os

    from gpu_worker.scheduling import timing_cpus

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    n = len(os.sched_getaffinity(0))
    split = timing_cpus(_cores_setting("1"))
    if n < 2:
        assert split is None
    else:
        timed, rest = split
        assert len(timed) == 1 and len(rest) == n - 1 and not timed & rest
    assert timing_cpus(_cores_setting("0")) is None


def test_pool_readies_spares_before_handing_them_out():
    # on CUDA the harness passes its _cuda_init here (the context is made in an untimed device job);
    # the same path on the CPU: spares start side by side, are readied side by side (each once), then handed out
    import time as _t

    from gpu_worker.scheduling import SandboxPool

    import threading

    readied = []
    # both spares must be readied at once (side by side): readied one after another, the first would wait
    # here for the second until the barrier broke, and would be dropped
    both = threading.Barrier(2, timeout=60)

    def ready(sb):
        r = sb.call(CudaInit(), 120)
        assert r.ok and r.result.cuda is False
        both.wait()
        readied.append(sb)

    pool = SandboxPool(interpreter=True, spares=2, ready=ready)
    try:
        end = _t.monotonic() + 120
        while len(pool._idle) < 2 and _t.monotonic() < end:
            _t.sleep(0.2)
        assert len(readied) == 2 and len(pool._idle) == 2
        sb = pool.acquire()
        assert sb in readied and sb.alive()
        sb.close()
    finally:
        pool.close()




def test_timing_cpus_explicit():
    import os

    from gpu_worker.scheduling import timing_cpus

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one core")
    timed, rest = timing_cpus(_cores_setting(f"{cpus[-1]}-{cpus[-1]}"))
    assert timed == {cpus[-1]} and rest == set(cpus[:-1])
    assert timing_cpus(_cores_setting("9999,10000")) is None  # cores this host does not have: no split


def test_context_and_triton_keys_are_two_commands():
    """The CUDA context (made in a device job) and Triton's per-process keys (host work, outside any turn)
    are separate child commands, each idempotent; on the CPU both are no-ops that answer."""
    from gpu_worker.sandbox import Sandbox

    sb = Sandbox("candidate", interpreter=True)
    try:
        for request in (CudaInit(), WarmTriton(), WarmTriton()):
            r = sb.call(request, 120)
            assert r.ok, r
    finally:
        sb.close()








def test_timing_stops_early_only_for_a_candidate_clearly_slower_than_the_best(tmp_path):
    """The interleaved blocks end after the first when the candidate is already shown slower than the current
    best (it cannot be accepted); a candidate level with the best, or a run without one, gets every block."""
    from workflows.artifacts import ArtifactStore
    from gpu_worker.harness import Evaluator
    from gpu_worker.scheduling import Scheduler

    e = Evaluator(store=ArtifactStore(tmp_path / "art"), interpreter=True, scheduler=Scheduler(spares=0))
    plan = {"blocks": 5, "reps": 20, "warmup": 1, "rotate": 2, "pool": 2, "host_reps": 1}

    class Child:
        def __init__(self, ms):
            self.ms, self.calls = ms, 0

        def call(self, request, timeout, hb=None):
            from gpu_worker.protocol import HostLatency, Timed

            if request.cmd == "time":
                self.calls += 1
                return Reply(seq=None, result=Timed(times=[self.ms + 0.001 * (i % 7) for i in range(request.reps)],
                                                    mode="interpreter", checks=[], check_names=[]))
            return Reply(seq=None, result=HostLatency(walls=[self.ms] * request.reps))

    def run(cand_ms, with_best=True):
        cand, base, best = Child(cand_ms), Child(2.0), Child(1.0) if with_best else None
        return e._interleave(None, "normal", cand, base, best, plan, None), cand

    res, cand = run(1.2)
    assert res["blocks"] == 1 and res["planned_blocks"] == 5 and cand.calls == 1
    assert len(res["cand"]) == len(res["base"]) == len(res["best"]) == 20
    res, cand = run(1.0)  # level with the best: no decision, every block
    assert res["blocks"] == 5 and cand.calls == 5
    res, cand = run(0.8)  # faster: every block, for the acceptance's interval
    assert res["blocks"] == 5
    res, cand = run(1.2, with_best=False)  # no best to compare with
    assert res["blocks"] == 5 and len(res["cand"]) == 100
    e.close()


def test_child_sets_its_limits_itself_without_code_between_fork_and_exec():
    """No core dumps and, under the interpreter, an address-space cap: set by the child first thing (no
    preexec_fn, which can deadlock a multi-threaded worker's fork; a CI run hung that way)."""
    import inspect
    import os

    from gpu_worker import sandbox
    from gpu_worker.scheduling import TIMING_CPUS, Scheduler

    assert "preexec_fn=" not in inspect.getsource(sandbox)
    sb = Scheduler().spawn("candidate", interpreter=True)
    try:
        assert sb.call(CudaInit(), 120).ok  # the child is up and serving
        limits = open(f"/proc/{sb.proc.pid}/limits").read().splitlines()
        core = next(line for line in limits if line.startswith("Max core file size")).split()
        assert core[4:6] == ["0", "0"]
        space = next(line for line in limits if line.startswith("Max address space")).split()
        assert int(space[3]) == 2 * sb.mem_limit
        if TIMING_CPUS:
            assert os.sched_getaffinity(sb.proc.pid) == set(TIMING_CPUS[1])
    finally:
        sb.close()


def test_verification_steps_run_in_order_only(ev, store):
    """Verification is one call per step (each case, the rerun, the stale probe, the reply), so that each
    is a device job of its own. A step out of order is an error, never a half-checked reply."""
    from baselines.registry import get_problem

    p = get_problem("softmax")
    from gpu_worker.protocol import Prepare, VerifyCase, VerifyReply, VerifyRerun, VerifyStale

    p = get_problem("softmax")
    cases = list(ev.cases(p, "steps"))
    sb, _ = ev._loaded_child(("x",), canary("fast"), p, ev._shape(p, None), None)
    try:
        assert sb.call(Prepare(cases=cases), 120).ok
        for step in (VerifyCase(cases=cases, i=1), VerifyRerun(cases=cases), VerifyStale(cases=cases)):
            r = sb.call(step, 120)
            assert not r.ok and "out of order" in r.failure.error, (step, r)
        assert "out of order" in sb.call(VerifyReply(), 120).failure.error
        for i in range(len(cases)):
            assert sb.call(VerifyCase(cases=cases, i=i), 120).ok
        assert "out of order" in sb.call(VerifyCase(cases=cases, i=len(cases) + 1), 120).failure.error
        assert sb.call(VerifyRerun(cases=cases), 120).ok
        assert "out of order" in sb.call(VerifyCase(cases=cases, i=len(cases)), 120).failure.error
        assert sb.call(VerifyStale(cases=cases), 120).ok
        r = sb.call(VerifyReply(), 120).result
        assert [(c.dist, c.seed) for c in r.cases] == cases
        assert r.rerun is not None and r.stale is not None and r.timing["first-call"] >= 0
        assert not any(c.mutated for c in r.cases)
        assert "out of order" in sb.call(VerifyReply(), 120).failure.error  # the state went with the reply
    finally:
        sb.close()


def test_the_serial_default_gives_the_scheduled_verdicts(ev, store):
    """An Evaluator without a scheduler: no device owner, no spares, no hand-on; same verdicts."""
    from gpu_worker.harness import Evaluator, SerialScheduler

    serial = Evaluator(store=store, interpreter=True, timeouts={"verify": 40, "compile": 60})
    try:
        assert isinstance(serial.sched, SerialScheduler) and not serial.owner.retries_alone
        for name in ("fast", "wrong"):
            r = req(store, canary(name))
            got, want = serial.verify(r), ev.verify(r)
            assert (got.ok, got.stage) == (want.ok, want.stage), name
            assert len(serial.loaded) == 0  # nothing waits between stages
    finally:
        serial.close()


def test_the_child_refuses_an_unknown_command_and_a_malformed_request_and_keeps_serving():
    """Anything but a declared request with its exact fields and types gets one `protocol` failure reply,
    carrying the request's number; the child neither acts on it nor crashes nor hangs."""
    from gpu_worker import protocol
    from gpu_worker.sandbox import Sandbox

    sb = Sandbox("candidate", interpreter=True)
    try:
        cases = [("standard", 0)]
        for wire, why in (
                ({"cmd": "format_disk"}, "unknown command 'format_disk'"),
                ({"cmd": "stage", "cases": "all"}, "malformed stage request: cases"),
                ({"cmd": "stage", "cases": cases, "extra": 1}, "malformed stage request: extra"),
                ({"cmd": "time", "reps": "20"}, "malformed time request: reps"),
                ({"cmd": "verify_case", "cases": cases}, "malformed verify_case request: i: Field required"),
                ({"cmd": "load", "source": 3, "problem": "softmax", "shape": None}, "malformed load request: source")):
            r = sb._exchange(wire, protocol.Stage, 60)
            assert not r.ok and r.failure.kind == "protocol" and why in r.failure.error, (wire, r)
            assert sb.alive()
        assert sb.call(CudaInit(), 60).ok  # still serving, replies still in step
    finally:
        sb.close()


def test_a_reply_that_does_not_fit_its_request_is_a_protocol_failure():
    from gpu_worker import protocol

    good = protocol.reply_to_wire(3, protocol.Staged(seconds=0.5))
    assert protocol.read_reply(protocol.Stage, good).result == protocol.Staged(seconds=0.5)
    wrong = protocol.read_reply(protocol.Time, good)  # a stage's result read as a timing's
    assert not wrong.ok and wrong.seq == 3 and wrong.failure.kind == "protocol" and "times" in wrong.failure.error
    broken = protocol.read_reply(protocol.Stage, {"seq": 3, "result": {"seconds": "soon"}})
    assert not broken.ok and broken.failure.kind == "protocol"
    assert not protocol.read_reply(protocol.Stage, "not a reply").ok


def test_every_declared_request_has_a_handler_in_the_child():
    from gpu_worker import child, protocol

    assert set(child.COMMANDS) | {protocol.Exit} == set(protocol.REQUESTS.values())
