"""The evaluator: compile, verify, benchmark, profile and self-test candidates, independent of Temporal.

Process layout (why the numbers can be trusted):

* this process (the worker) owns statistics, thresholds and decisions; it never loads candidate code;
* one *reference* child per (problem, shape) computes the oracle and the primary baseline's outputs, keeps
  the oracle on its device and compares every candidate output with it there, and times the baseline; it
  is trusted code only;
* every candidate is loaded into a fresh *candidate* child (single use) whose guard was installed before
  the candidate's module executed. Timing inside that child uses event/synchronize/perf_counter objects
  captured before the load and re-checked for identity after every call; a new best is additionally
  re-measured in another fresh child and cross-checked against torch.profiler's kernel time, then proven
  by Nsight Compute's trace of a separate process (harness.ncu_proof).

All rejections are returned as reports; only infrastructure failures (artifact store) raise.
"""

from __future__ import annotations

import time

from gpu_worker import protocol as msg
from gpu_worker.harness.benchmark import BenchmarkStage
from gpu_worker.harness.best_checks import BestOnlyChecks
from gpu_worker.harness.cases import CaseVerification
from gpu_worker.harness.children import CandidateChildren, DeviceTurns
from gpu_worker.harness.compile import CompileStage
from gpu_worker.harness.context import StageContext, default_timeouts
from gpu_worker.harness.ncu_proof import NcuProofCheck
from gpu_worker.harness.references import ReferenceChildren
from gpu_worker.harness.serial import SerialScheduler
from gpu_worker.harness.timed_outputs import TimedOutputChecks
from gpu_worker.harness.verify import VerifyStage
from gpu_worker.phases import Heartbeat
from gpu_worker.phases import waiting_heartbeat as _waiting_heartbeat
from gpu_worker.selftest_verdict import SelfTestVerdict
from gpu_worker.settings import GpuWorkerSettings, cuda_available
from workflows.artifacts import ArtifactStore
from workflows.contracts import BenchReport, BenchRequest, CompileReport, EvalRequest, ProfileReport, VerifyReport


class Evaluator:
    """Judges candidates stage by stage. Each stage is an object of its own, built here with exactly what
    it uses: the shared `ctx` (harness.context.StageContext), the device turns (`turns`), the candidates'
    children (`children`), the reference children (`refs`) and the other stages it calls:
    `compile_stage` (harness.compile), `verify_stage` (harness.verify) over `verification`
    (harness.cases), `bench_stage` (harness.benchmark) with `timed_outputs` (harness.timed_outputs),
    `best_checks` (harness.best_checks) and `proof` (harness.ncu_proof). The public methods delegate.

    `settings`: the worker's (GpuWorkerSettings.from_env at its start); None takes the defaults. They are
    resolved here for this evaluator's device and handed to every child it starts."""

    def __init__(self, store: ArtifactStore | None = None, interpreter: bool | None = None,
                 timeouts: dict | None = None, static_rules: bool = True, scheduler=None,
                 settings: GpuWorkerSettings | None = None):
        settings = settings or GpuWorkerSettings()
        interpreter = (not cuda_available(settings)) if interpreter is None else interpreter
        cuda = not interpreter
        # the device owner, spares, hand-on and pinning (see SerialScheduler): the caller's choice
        self.sched = scheduler if scheduler is not None else SerialScheduler()
        self.ctx = StageContext(store=store or ArtifactStore(), settings=settings.for_device(cuda), cuda=cuda,
                                interpreter=interpreter, sched=self.sched, owner=self.sched.owner,
                                loaded=self.sched.loaded, timeouts=default_timeouts(cuda, timeouts),
                                static_rules=static_rules)
        self.owner, self.loaded = self.ctx.owner, self.ctx.loaded
        # the one holder of this worker's self-test verdict: the activities refuse work after a failure, and
        # timed work waits on it while a start-up self-test runs (gpu_worker.activities)
        self.selftest_verdict = SelfTestVerdict()
        self.turns = DeviceTurns(self.ctx)
        self.refs = ReferenceChildren(self.ctx, self.turns)
        # a CUDA pool's background thread readies spares as soon as the children are made
        self.children = CandidateChildren(self.ctx, self.turns)
        self.compile_stage = CompileStage(self.ctx, self.turns, self.children)
        self.verification = CaseVerification(self.ctx, self.turns, self.children, self.refs, self.compile_stage)
        self.best_checks = BestOnlyChecks(self.ctx, self.turns, self.children, self.refs, self.verification)
        self.verify_stage = VerifyStage(self.ctx, self.children, self.verification, self.best_checks)
        self.timed_outputs = TimedOutputChecks(self.ctx, self.children, self.refs)
        self.proof = NcuProofCheck(self.ctx, self.turns, self.children.renders)
        self.bench_stage = BenchmarkStage(self.ctx, self.turns, self.children, self.refs, self.compile_stage,
                                          self.timed_outputs, self.best_checks, self.proof)

    # what the callers read of the context
    store = property(lambda self: self.ctx.store)
    settings = property(lambda self: self.ctx.settings)
    cuda = property(lambda self: self.ctx.cuda)
    interpreter = property(lambda self: self.ctx.interpreter)
    timeouts = property(lambda self: self.ctx.timeouts)
    timing_seed = property(lambda self: self.ctx.timing_seed)
    ceilings = property(lambda self: self.refs.ceilings)

    def close(self):
        self.children.close()
        self.refs.close()

    # --- the stages ------------------------------------------------------------------------------
    def compile(self, req: EvalRequest, hb: Heartbeat = None) -> CompileReport:
        return self.compile_stage.compile(req, hb)

    def verify(self, req: EvalRequest, hb: Heartbeat = None, prepare_next: bool = True) -> VerifyReport:
        return self.verify_stage.verify(req, hb, prepare_next)

    def benchmark(self, req: BenchRequest, hb: Heartbeat = None) -> BenchReport:
        return self.bench_stage.benchmark(req, hb)

    def ensure_ceilings(self, problem, shape, hb) -> msg.Ceilings | None:
        return self.refs.ensure_ceilings(problem, shape, hb)

    def warm(self, problem_name: str, shape_name: str | None = None, hb: Heartbeat = None,
             light: bool = False) -> dict:
        """Worker start-up: measure the ceilings and compute the oracle bank for every (distribution, seed)
        of the seed pool, so that no candidate's verification pays for a first oracle. `light` (a shape
        only a would-be best's checks visit): the reference child and one case per distribution, whose
        baseline's first call autotunes (into Triton's cache), no ceilings, no timing sets."""
        if light:
            return self._warm_light(problem_name, shape_name, hb)
        _waiting_heartbeat(hb)
        ctx = self.ctx
        t0 = time.monotonic()
        problem = ctx.problem(problem_name)
        shape = ctx.shape(problem, shape_name)
        # where the warm-up's time goes (about 130 s for KDA, most of it FLA's first call): returned
        # per part, and per case by the reference child (inputs, oracle, baseline), for the worker's log
        parts: dict[str, float] = {}
        t = time.monotonic()
        ref_sb, ref_lock, _ = self.refs.child(problem, shape, hb)
        parts["reference-child"] = time.monotonic() - t
        t = time.monotonic()
        self.refs.ensure_ceilings(problem, shape, hb)
        parts["ceilings"] = time.monotonic() - t
        cases = [(d, s) for s in range(ctx.settings.seed_pool) for d in problem.distributions]
        t = time.monotonic()
        for i in range(0, len(cases), 4):
            self.refs.reference(problem, shape, cases[i:i + 4], hb, timing=True)
        parts["oracles"] = time.monotonic() - t
        parts.update({f"oracles.{k}": v for k, v in self.refs.case_timing(problem, shape, cases).items()})
        # the timing sets as well: generated here, they reach the input bank before any benchmark needs them
        t = time.monotonic()
        for dist in problem.distributions:
            self.refs.stage_timing_set(ref_sb, ref_lock, hb, dist)
            with self.turns.with_ref(ref_lock):
                self.refs.do(ref_sb, hb, ctx.timing_set_request(dist), ctx.timeouts["load"])
        parts["timing-sets"] = time.monotonic() - t
        return {"problem": problem_name, "shape": shape.name, "oracles": len(cases), "seconds": time.monotonic() - t0,
                "parts": {k: round(v, 1) for k, v in parts.items()}}

    def _warm_light(self, problem_name: str, shape_name: str | None, hb: Heartbeat) -> dict:
        t0 = time.monotonic()
        problem = self.ctx.problem(problem_name)
        shape = self.ctx.shape(problem, shape_name)
        cases = [(d, 0) for d in problem.distributions]
        # in a timing block, as the primary shape's bank: the baseline's autotuning is kept on disk, so it
        # must not be measured beside other work
        refs = self.refs.reference(problem, shape, cases, hb, timing=bool(self.ctx.cuda))
        return {"problem": problem_name, "shape": shape.name, "oracles": len(cases), "seconds": time.monotonic() - t0,
                "parts": {"cached": sum(1 for r in refs if "cached" in r.timing)}}

    def warm_shapes(self, problem_name: str, shapes: list[str], keep: str | None = None,
                    hb: Heartbeat = None) -> list[dict]:
        """Worker start-up (MARATHON_WARM_ALL_SHAPES): each of `shapes` warmed lightly (warm(light=True)),
        then its reference child closed, all but `keep`'s (the shape a would-be best is verified at next,
        whose child stays for it): what stays is on disk, in the caches, not on the device."""
        out = []
        for name in shapes:
            out.append(self.warm(problem_name, name, hb, light=True))
            if name != keep:
                self.close_reference(problem_name, name)
        return out

    def close_reference(self, problem_name: str, shape_name: str) -> bool:
        """Close the reference child of (problem, shape), if one runs; a later call starts another."""
        return self.refs.close_child(problem_name, shape_name)

    # --- profile ---------------------------------------------------------------------------------
    def profile(self, req: EvalRequest, hb: Heartbeat = None) -> ProfileReport:
        _waiting_heartbeat(hb)
        from gpu_worker.profile import profile_candidate

        return profile_candidate(self, req, hb)

    # --- self-test -------------------------------------------------------------------------------
    def selftest(self, hb: Heartbeat = None, reuse: bool = False) -> dict:
        """Run the canaries (gpu_worker.canaries) and settle `selftest_verdict` with their result, replacing
        any earlier one: a pass lifts a refusal, a failure imposes one. A self-test that raises settles
        nothing. A pass is kept on disk (SelfTestRecord); with `reuse` (a worker's start) a kept pass of
        this harness on this host and GPU model settles the verdict instead of the canaries."""
        from gpu_worker.canaries import run_canaries
        from gpu_worker.selftest_verdict import SelfTestRecord

        record = SelfTestRecord(self.ctx.settings, self.ctx.cuda)
        result = record.load() if reuse else None
        if result is None:
            result = run_canaries(self, hb)
            record.store(result)
        self.selftest_verdict.settle(result)
        return result
