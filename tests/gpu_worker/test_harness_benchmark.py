"""The benchmark stage (gpu_worker.harness.benchmark): the starting kernel compiled, verified and timed
against the baseline and the current best, and the interleaved blocks stopped early only for a candidate
already shown slower than the best."""

from __future__ import annotations

import pytest

from gpu_worker.wire import Reply
from tests.gpu_worker.harnesses import canary, req
from workflows.contracts import BenchRequest, BestRef


@pytest.mark.slow(45)
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
    assert b.receipt.proof == "" and "ncu proof" not in log  # no device kernels: the interpreter proves nothing


def test_timing_stops_early_only_for_a_candidate_clearly_slower_than_the_best(tmp_path):
    """The interleaved blocks end after the first when the candidate is already shown slower than the current
    best on the decisive distribution; a candidate level with the best, one timed on another distribution,
    or a run without a best gets every block."""
    from workflows.artifacts import ArtifactStore
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler

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

    def run(cand_ms, with_best=True, decisive=True):
        cand, base, best = Child(cand_ms), Child(2.0), Child(1.0) if with_best else None
        return e.bench_stage.interleave(None, "normal", cand, base, best, plan, None, decisive), cand

    res, cand = run(1.2)
    assert res.blocks == 1 and res.planned_blocks == 5 and cand.calls == 1
    assert len(res.cand) == len(res.base) == len(res.best) == 20
    res, cand = run(1.0)  # level with the best: no decision, every block
    assert res.blocks == 5 and cand.calls == 5
    res, cand = run(0.8)  # faster: every block, for the acceptance's interval
    assert res.blocks == 5
    res, cand = run(1.2, decisive=False)  # slower where the best is not at its slowest: decides nothing
    assert res.blocks == 5 and cand.calls == 5
    res, cand = run(1.2, with_best=False)  # no best to compare with
    assert res.blocks == 5 and len(res.cand) == 100
    e.close()


def test_on_a_gpu_each_side_captures_in_its_preparation_job_and_the_window_only_times(tmp_path):
    """With a device (stand-in children answering), every side's timing set is prepared and its graphs
    captured in one untimed job of its own (the reference's pool drawn before it, outside any turn); the timing window holds timed blocks and host latency only, in
    graph mode where every side captured and back to back where one did not."""
    import contextlib

    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.harness import Evaluator
    from gpu_worker.phases import phases_begin, phases_end
    from gpu_worker.protocol import Captured, HostLatency, Prepared, Staged, Timed
    from workflows.artifacts import ArtifactStore

    e = Evaluator(store=ArtifactStore(tmp_path / "art"), interpreter=True, scheduler=Scheduler(spares=0))
    where = ["host"]
    asked = []

    class Child:
        def __init__(self, who, captures=True):
            self.who, self.captures = who, captures

        def alive(self):
            return False

        def call(self, request, timeout, hb=None):
            asked.append((self.who, request.cmd, where[0], getattr(request, "capture", None),
                          getattr(request, "mode", None)))
            if request.cmd == "stage_timing":
                return Reply(seq=None, result=Staged(seconds=0.0))
            if request.cmd == "prepare":
                cap = Captured(captured=self.captures, why="" if self.captures else "stand-in refuses")
                return Reply(seq=None, result=Prepared(timing={}, captured=cap if request.capture else None))
            if request.cmd == "time":
                return Reply(seq=None, result=Timed(times=[1.0] * request.reps, mode=request.mode, checks=[],
                                                    check_names=[]))
            return Reply(seq=None, result=HostLatency(walls=[1.0] * request.reps))

    @contextlib.contextmanager
    def turn(name):
        assert where[0] == "host", f"{name} inside {where[0]}"
        where[0] = name
        try:
            yield
        finally:
            where[0] = "host"

    e.turns.job = lambda: turn("job")
    e.turns.with_ref = lambda lock, timing=False: turn("window" if timing else "ref-job")
    e.ctx.settings = e.ctx.settings.model_copy(update={"bench_blocks": 2})
    try:
        e.ctx.cuda = True
        for best_captures, mode in ((True, "cuda-graph"), (False, "back-to-back")):
            asked.clear()
            phases_begin()
            res = e.bench_stage.time_distribution(None, None, "normal", Child("cand"), Child("base"),
                                                  contextlib.nullcontext(), Child("best", best_captures), None,
                                                  [0.0])
            ph = phases_end()
            assert res.mode == mode and res.captures == {"cand": True, "base": True, "best": best_captures}
            prepares = [(who, w, cap) for who, cmd, w, cap, _ in asked if cmd == "prepare"]
            assert sorted(prepares) == [("base", "ref-job", True), ("best", "job", True), ("cand", "job", True)]
            # the reference's pool drawn before, in no turn
            assert [(who, w) for who, cmd, w, _, _ in asked if cmd == "stage_timing"] == [("base", "host")]
            timed = [a for a in asked if a[1] == "time"]
            assert timed and all(w == "window" and m == mode for _, _, w, _, m in timed), timed
            assert {cmd for _, cmd, w, _, _ in asked if w == "window"} == {"time", "host_latency"}
            assert ("no-capture.best" in ph) == (not best_captures)
    finally:
        e.ctx.cuda = False
        e.close()
