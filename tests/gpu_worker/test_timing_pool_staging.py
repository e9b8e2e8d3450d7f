"""A timing set's pool is read before the untimed device job that makes the set, in host work. The reference
child draws it (`stage_timing`, under its lock alone: on KDA about a second a case on a core, which the job
held before); a candidate's child kept from verification for its benchmark maps the banked pool in with the
verification's staging. Counted from the children's replies on the interpreter's harness."""

from __future__ import annotations

import pytest

from tests.gpu_worker.harnesses import canary, req
from gpu_worker import protocol as msg
from workflows.contracts import BenchRequest


@pytest.mark.slow(30)
def test_the_reference_draws_its_timing_pools_outside_the_device_job(store, tmp_path, monkeypatch):
    import gpu_worker.harness as h
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.sandbox import Sandbox
    from gpu_worker.settings import GpuWorkerSettings

    replies, real = [], Sandbox.call

    def call(sb, request, *a, **kw):
        r = real(sb, request, *a, **kw)
        if sb.role == "reference" and request.cmd in ("stage_timing", "prepare") and r.ok:
            replies.append((request.cmd, getattr(request, "rotate", None), r.result))
        return r

    monkeypatch.setattr(Sandbox, "call", call)
    e = h.Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0),
                    settings=GpuWorkerSettings(gpu_workdir=tmp_path, seed_pool=3))
    try:
        r = req(store, canary("fast"))
        assert e.compile(r).ok and e.verify(r).ok
        b = e.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))
        assert b.ok, b.reason
        assert e.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key,
                                        fresh_process=True)).ok
        # the same request without the staging before it: the set's job draws the pool itself
        problem = e.ctx.problem("softmax")
        sb, lock, _ = e.refs.child(problem, e.ctx.shape(problem, None), None)
        with lock:
            unstaged = e.refs.do(sb, None, msg.Prepare(rotate=2, pool=2, dist=problem.distributions[0], seed=77),
                                 e.ctx.timeouts["load"])
    finally:
        e.close()
    order = [cmd for cmd, _, _ in replies]
    sets = [res for cmd, rotate, res in replies if cmd == "prepare"][:-1]
    assert len(sets) == 4 and order[:8] == ["stage_timing", "prepare"] * 4, order  # two benchmarks, two dists
    assert all("timing-sets-n" in res.timing and "generate-n" not in res.timing for res in sets), sets
    assert unstaged.timing.get("generate-n") == 2, unstaged.timing


@pytest.mark.slow(40)
def test_a_kept_child_reads_its_timing_pools_before_its_benchmark(store, tmp_path, monkeypatch):
    """A candidate's child kept from its verification for its benchmark maps the banked timing pools in with
    the verification's staging, and a child parked for a later benchmark (the best's) with its park: their
    sets' jobs read no bank file. A child that was neither still reads its pools inside the job."""
    import gpu_worker.harness as h
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.sandbox import Sandbox
    from gpu_worker.settings import GpuWorkerSettings
    from workflows.contracts import BestRef

    asked, sets, real = {}, [], Sandbox.call

    def call(sb, request, *a, **kw):
        r = real(sb, request, *a, **kw)
        if sb.role == "candidate":
            if request.cmd == "prepare" and request.rotate and r.ok:
                sets.append((set(asked.get(id(sb), ())), r.result.timing))
            asked.setdefault(id(sb), set()).add(request.cmd)
        return r

    monkeypatch.setattr(Sandbox, "call", call)
    e = h.Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0),
                    settings=GpuWorkerSettings(gpu_workdir=tmp_path, seed_pool=3))
    try:
        e.warm("softmax")  # the reference banks the timing pools
        first, second = req(store, canary("fast")), req(store, canary("fast") + "\n# another\n")
        assert e.compile(first).ok and e.verify(first).ok
        b = e.benchmark(BenchRequest(problem="softmax", candidate_id=first.candidate_id, source_key=first.source_key))
        assert b.ok, b.reason
        best = BestRef(candidate_id=first.candidate_id, source_key=first.source_key, speedup=b.speedup,
                       time_ms=b.time_ms, baseline_ms=b.baseline_ms, iteration=1, interpreter=True)
        assert e.compile(second).ok and e.verify(second).ok
        for fresh in (False, True):  # against the first, kept and parked; then in a fresh process
            assert e.benchmark(BenchRequest(problem="softmax", candidate_id=second.candidate_id,
                                            source_key=second.source_key, best=best, fresh_process=fresh)).ok
        # a child benchmarked straight after its compile was neither staged for a verification nor parked
        third = req(store, canary("fast") + "\n# a third\n")
        assert e.compile(third).ok
        assert e.benchmark(BenchRequest(problem="softmax", candidate_id=third.candidate_id,
                                        source_key=third.source_key)).ok
    finally:
        e.close()
    kept = [t for before, t in sets if before & {"stage", "park"}]
    fresh = [t for before, t in sets if not before & {"stage", "park"}]
    assert len(kept) >= 4 and all("bank-n" not in t for t in kept), sets
    assert fresh and all(t.get("bank-n") == 2 for t in fresh), sets
