"""The Evaluator's children (gpu_worker.harness.children): an oracle computed once however many callers want
it, and a candidate's loaded child handed on from compile to verify to benchmark."""

from __future__ import annotations

import pytest

from tests.gpu_worker.harnesses import canary, kernel, req
from workflows.contracts import BenchRequest, BestRef


def test_an_oracle_is_computed_once_when_two_callers_want_it(store):
    """Warm-up and an early verification may ask for the same case at once; the one that waited for the
    reference child finds the other's entry (with its timings) and computes nothing again."""
    import contextlib
    import threading

    from gpu_worker.harness import Evaluator
    from gpu_worker.protocol import ReferenceCase, References, Staged
    from gpu_worker.wire import Reply
    from gpu_worker.device.scheduling import Scheduler

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    try:
        p = e.ctx.problem("softmax")
        sh = e.ctx.shape(p, None)
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
            e.refs.meta[(p.name, sh.name, *case)] = first
            yield

        e.refs.child = lambda problem, shape, hb: (Child(), threading.Lock(), {})
        e.turns.with_ref = racing_lock
        assert e.refs.reference(p, sh, [case], None) == [first]
        assert "reference" not in calls  # (its inputs were staged, host work before the device turn)
        calls.clear()
        assert e.refs.reference(p, sh, [case, other], None)[0] == first and calls == ["stage", "reference"]
    finally:
        e.close()



def test_a_childs_cuda_context_is_made_once_not_again_at_its_load(store):
    """A spare the pool readied (CUDA context and Triton's keys made) asks for no device job at its load:
    one job and two commands a child, whether readied early or at the load."""
    import contextlib

    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    try:
        p = e.ctx.problem("softmax")
        sh = e.ctx.shape(p, None)
        asked, jobs = [], []

        @contextlib.contextmanager
        def job():
            jobs.append(1)
            yield

        e.children.ask = lambda sb, request, timeout, stage, hb: asked.append((sb, request.cmd))
        e.turns.job = job
        e.ctx.cuda = True  # the CUDA path of a load, its commands answered by the stand-in above
        spare, fresh = object.__new__(type("Child", (), {})), object.__new__(type("Child", (), {}))
        e.children.cuda_init(spare)  # the pool readying a spare
        e.children.load(spare, "src", p, sh, None)
        e.children.load(fresh, "src", p, sh, None)
        assert [c for sb, c in asked if sb is spare] == ["cuda_init", "warm_triton", "load"], asked
        assert [c for sb, c in asked if sb is fresh] == ["cuda_init", "warm_triton", "load"], asked
        assert len(jobs) == 2
    finally:
        e.ctx.cuda = False
        e.close()

@pytest.mark.slow(90)
def test_child_handed_on_from_compile_to_verify_to_benchmark(store):
    from gpu_worker.harness import Evaluator
    from gpu_worker.phases import phases_begin, phases_end
    from gpu_worker.device.scheduling import Scheduler

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    try:
        draft = req(store, canary("slow"))  # a compile tool's: no verification need follow, its child parked
        assert e.compile(draft).ok and e.loaded._kept[-1][3] is True
        e.loaded.close()
        r = req(store, canary("fast")).model_copy(update={"next_stage": True})  # an evaluation's
        phases_begin()
        assert e.compile(r).ok and len(e.loaded) == 1 and e.loaded._kept[-1][3] is False
        assert "admit-wait" in phases_end()
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
