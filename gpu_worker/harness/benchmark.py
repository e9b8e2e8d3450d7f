"""The benchmark stage: candidate, baseline (and the current best) timed interleaved by device time on
every input distribution, the worst speedup deciding, with the physical floor and the receipt."""

from __future__ import annotations

import contextlib
import os
import time

from gpu_worker import protocol as msg
from gpu_worker.harness.best_checks import BestOnlyChecks
from gpu_worker.harness.children import HOST_SUSPECTED, CandidateChildren, DeviceTurns
from gpu_worker.harness.compile import CompileStage
from gpu_worker.harness.context import StageContext
from gpu_worker.harness.ncu_proof import NcuProofCheck
from gpu_worker.harness.references import ReferenceChildren
from gpu_worker.harness.timed_outputs import TimedDistribution, TimedOutputChecks, _check_entries
from gpu_worker.phases import Heartbeat
from gpu_worker.phases import add_phase as _add_phase
from gpu_worker.phases import phase as _phase
from gpu_worker.phases import waiting_heartbeat as _waiting_heartbeat
from gpu_worker.sandbox import Rejection, SandboxFailure
from gpu_worker.timing import (another_block, choose_mode, decide, decisive_dist, distribution_figures, median,
                               shown_slower)
from workflows.contracts import BenchReport, BenchRequest, DeviceFacts, DistributionTiming, Receipt


class BenchmarkStage:
    """The Evaluator's benchmark stage (see the module's docstring). What a would-be best gets besides
    goes through `best` (the profiler cross-check) and `proof` (the ncu proof); what timed calls returned
    is checked by `timed_outputs`."""

    def __init__(self, ctx: StageContext, turns: DeviceTurns, children: CandidateChildren,
                 refs: ReferenceChildren, compiler: CompileStage, timed_outputs: TimedOutputChecks,
                 best: BestOnlyChecks, proof: NcuProofCheck):
        self.ctx, self.turns, self.children, self.refs = ctx, turns, children, refs
        self.compiler, self.timed_outputs, self.best, self.proof = compiler, timed_outputs, best, proof

    def benchmark(self, req: BenchRequest, hb: Heartbeat = None) -> BenchReport:
        return self.children.retried_alone(lambda: self._benchmark_once(req, hb))

    def _benchmark_once(self, req: BenchRequest, hb: Heartbeat = None) -> BenchReport:
        """Candidate, baseline (and the current best, when given) timed interleaved by device time on every
        input distribution of the problem; the worst speedup decides (gpu_worker.timing)."""
        _waiting_heartbeat(hb)
        ctx = self.ctx
        source = ctx.source(req.source_key)
        best_source = ctx.source(req.best.source_key) if req.best else None
        gpu_s = [0.0]
        try:
            problem, shape = ctx.checked(req, source)
            ref_sb, ref_lock, ref_info = self.refs.child(problem, shape, hb)
            ceil = self.refs.ensure_ceilings(problem, shape, hb)
            sbs, keep = [], {}
            stage = contextlib.ExitStack()  # the stage, counted by the device owner: uploads to last comparison
            per_dist, timed_jobs, prof = [], [], None
            try:
                cand_key = ctx.child_key(req.problem, shape, req.source_key)
                cand, cand_loaded = self.children.loaded_child(cand_key, source, problem, shape, hb)
                sbs.append(cand)
                best = best_loaded = None
                if best_source:
                    # the current best's child stays loaded from one benchmark to the next (the best
                    # takes part in every one; benchmarks at once load children of their own)
                    best_key = ctx.child_key(req.problem, shape, req.best.source_key)
                    best, best_loaded = self.children.loaded_child(best_key, best_source, problem, shape, hb)
                    sbs.append(best)
                stage.enter_context(self.turns.stage())
                # a child loaded now compiles first, outside any turn, as verification's does: else Triton
                # compiles its kernels inside the timing set's upload job (KDA: about 8 s, every timing
                # block waiting behind it)
                for sb, loaded_now in ((cand, cand_loaded), (best, best_loaded)):
                    if loaded_now is not None:
                        self.compiler.compile_in(sb, problem, hb, "benchmark")
                # the timed calls' checks are bounded by the baseline's own error here, measured now if no
                # verification on this worker measured it: on the candidate's first seed, every distribution
                self.refs.ensure_baseline_errors(
                    problem, shape, ctx.cases(problem, req.candidate_id)[:len(problem.distributions)], hb)
                # clocks read before the timed sections: nvidia-smi, host work, the reference child's lock only
                with _phase("receipt"), ref_lock:
                    receipt = self.refs.do(ref_sb, hb, msg.Receipt(), 60)
                fresh = None
                if req.fresh_process and ctx.cuda:
                    fresh = self.children.pool.acquire()
                    sbs.append(fresh)
                    ld = self.children.load(fresh, source, problem, shape, hb)
                    self.compiler.compile_in(fresh, problem, hb, "benchmark")
                dists = list(problem.distributions)
                decisive = decisive_dist(dists, req.best.deciding_dist if best is not None else None)
                if decisive is not None:  # the distribution that can show a loser is timed first
                    dists.remove(decisive)
                    dists.insert(0, decisive)
                for dist in dists:
                    res = self.time_distribution(problem, shape, dist, cand, ref_sb, ref_lock, best, hb, gpu_s,
                                                 decisive=dist == decisive)
                    fig = distribution_figures(dist, res.cand, res.base, res.best or None, res.cand_host,
                                               res.base_host)
                    fig.mode, fig.blocks, fig.planned_blocks = res.mode, res.blocks, res.planned_blocks
                    fig.captures = res.captures
                    with _phase("timed-outputs"):
                        prints = self.timed_outputs.check_fingerprints(problem, shape, dist, res)
                        kept, jobs = self.timed_outputs.check_timed_outputs(problem, shape, dist, cand, hb, res)
                        fig.timed_outputs = f"{kept}; {prints}"
                    timed_jobs += jobs
                    per_dist.append(fig)
                    if shown_slower(fig, dist == decisive):  # a clear loser: the others are not timed
                        break
                verdict = decide(per_dist)
                if fresh is not None:
                    with _phase("crosscheck"):
                        prof = self.best.crosscheck(problem, verdict.worst, fresh, ref_sb, ref_lock,
                                                    ld.kernels, hb, gpu_s)
                stage.close()
                cand_log = cand.log_tail()
                if best is not None:
                    keep[id(best)] = best_key
                if not best or verdict.vs_best_ci is None or verdict.vs_best_ci[1] > 1.0:
                    keep[id(cand)] = cand_key  # it may be the best of the next benchmark
            finally:
                stage.close()
                for s in sbs:
                    if id(s) in keep and self.children.park(s, ctx.timing_pools(problem)):
                        ctx.loaded.put(keep[id(s)], s, parked=True)
                    else:
                        s.close()
            w = verdict.worst
            modes = sorted({d.mode for d in per_dist})
            mode = "interpreter" if ctx.interpreter else ", ".join(modes)
            # the ncu proof, in a separate process: every would-be best, a random share of the others
            proof = self.proof.proof_if_due(bool(req.fresh_process), problem, shape, source, w.dist, w.time_ms,
                                            hb, gpu_s)
            rec = Receipt(device=receipt.device, driver=receipt.driver, clocks=receipt.clocks, torch=receipt.torch,
                          triton=receipt.triton, baseline_env=receipt.baseline_env,
                          repetitions=sum(d.samples for d in per_dist),
                          spread="; ".join(f"{d.dist}: IQR {d.iqr_ms[0]:.4g}-{d.iqr_ms[1]:.4g} ms (baseline "
                                           f"{d.baseline_iqr_ms[0]:.4g}-{d.baseline_iqr_ms[1]:.4g} ms)"
                                           for d in per_dist),
                          mode=mode, proof=f"ncu proof: {proof.text}" if proof else "")
            lines = [f"judge: device time ({mode}); the worst speedup over {len(per_dist)} distributions decides"]
            for d in per_dist:
                host = (f"host latency of a synchronous call {d.host_ms:.4g} ms (baseline {d.baseline_host_ms:.4g} ms)"
                        if d.host_ms is not None and d.baseline_host_ms is not None else "host latency not measured")
                lines.append(f"[{d.dist}] {d.mode}: candidate {d.time_ms:.4g} ms, baseline {d.baseline_ms:.4g} ms, "
                             f"{d.speedup:.3f}x (95% CI {d.speedup_ci[0]:.3f}-{d.speedup_ci[1]:.3f})"
                             + (f", current best {d.best_time_ms:.4g} ms" if d.best_time_ms else "")
                             + f"; {host}; timed blocks {d.blocks} of {d.planned_blocks}"
                             + (" (stopped early: slower than the current best)" if d.blocks < d.planned_blocks else "")
                             + f"; captures {d.captures}; timed outputs {d.timed_outputs}")
            skipped = [d for d in problem.distributions if d not in {f.dist for f in per_dist}]
            if skipped:
                lines.append(f"not timed: {', '.join(skipped)} (already shown slower than the current best)")
            lines += [f"worst {verdict.speedup:.3f}x ({w.dist}), geometric mean {verdict.geomean_speedup:.3f}x",
                      f"receipt: {rec.model_dump()}"]
            if ctx.cuda:
                floor = problem.floor_ms(shape, 1.1 * ceil.bandwidth, 1.1 * ceil.flops)
                facts = DeviceFacts(device=receipt.device, bandwidth_tbps=ceil.bandwidth / 1e12,
                                    matmul_tflops=ceil.flops / 1e12,
                                    floor_ms=problem.floor_ms(shape, ceil.bandwidth, ceil.flops))
                if floor > 0:
                    lines.append(f"physical floor {floor:.4g} ms (ceilings: {ceil.bandwidth / 1e12:.2f} TB/s, "
                                 f"{ceil.flops / 1e12:.0f} TFLOP/s, +10% headroom)")
                else:
                    lines.append("physical floor: skipped (the problem names no FLOP or byte counts)")
                fastest = min(d.time_ms for d in per_dist)
                if fastest < floor:
                    raise Rejection("benchmark", f"impossible: {fastest:.4g} ms is below the physical floor {floor:.4g} ms "
                                    f"(min bytes / measured bandwidth, FLOPs / measured matmul rate)", "\n".join(lines))
            else:
                facts = None
                lines.append("physical floor: not checked (no GPU; interpreter timings say nothing about speed)")
            if prof is not None:
                lines.append(f"profiler cross-check: {prof.text}")
                if not prof.ok:
                    why = "library-kernel: " if prof.foreign else ""  # a kernel not its own Triton did work
                    raise Rejection("benchmark", f"{why}profiler cross-check failed: {prof.text}", "\n".join(lines))
            elif req.fresh_process:
                lines.append("profiler cross-check: skipped under the interpreter (no device kernels)")
            if proof is not None:
                lines.append(f"ncu proof: {proof.text}")
                if proof.ok is False:  # None: not made here (no ncu), which the line and the receipt say
                    why = HOST_SUSPECTED if proof.host_suspected else f"{proof.family}: " if proof.family else ""
                    raise Rejection("benchmark", f"{why}ncu proof failed: {proof.text}", "\n".join(lines))
            lines.append(cand_log)
            dists = [DistributionTiming(**{f: getattr(d, f) for f in DistributionTiming.model_fields}) for d in per_dist]
            vs_best = verdict.vs_best_ci
            return BenchReport(ok=True, time_ms=w.time_ms, baseline_ms=w.baseline_ms,
                               baseline_name=ref_info["setup"].baseline,
                               speedup=verdict.speedup, speedup_ci=verdict.speedup_ci,
                               best_time_ms=w.best_time_ms, vs_best_ci=vs_best,
                               vs_best=req.best.candidate_id if vs_best else None,
                               interpreter=ctx.interpreter, receipt=rec, log_key=ctx.log("\n".join(lines)),
                               gpu_seconds=gpu_s[0] if ctx.cuda else 0.0, distributions=dists,
                               deciding_dist=w.dist, geomean_speedup=verdict.geomean_speedup,
                               host_ms=w.host_ms, baseline_host_ms=w.baseline_host_ms,
                               kernel_ms=prof.kernel_ms if prof else None, device_facts=facts)
        except Rejection as rej:
            return BenchReport(ok=False, stage=rej.stage, reason=rej.reason[:4000], interpreter=ctx.interpreter,
                               log_key=ctx.log(rej.reason + "\n" + rej.log), gpu_seconds=gpu_s[0])
        except SandboxFailure as f:
            return BenchReport(ok=False, stage="sandbox", reason=f"{f.kind}: {f.reason}", interpreter=ctx.interpreter,
                               log_key=ctx.log(f"{f.kind}: {f.reason}\n{f.log}"), gpu_seconds=gpu_s[0])

    def time_distribution(self, problem, shape, dist: str, cand, ref, ref_lock, best, hb, gpu_s: list,
                          decisive: bool = True) -> TimedDistribution:
        """One distribution: every side prepares its timing set and, on a GPU, captures its graphs (one
        untimed device job each), the mode is chosen for all of them, and in one timing block candidate,
        baseline (and best) are timed in interleaved blocks; then each side's host latency."""
        ctx = self.ctx
        plan = ctx.plan()
        prep = ctx.timing_set_request(dist, capture=ctx.cuda)
        self.refs.stage_timing_set(ref, ref_lock, hb, dist)  # host work, before any of the sets' jobs
        sides = [(who, sb) for who, sb in (("cand", cand), ("best", best)) if sb is not None]
        captures = {}
        for who, sb in sides:  # one job each: a waiting timing block waits for the shorter one
            with _phase("prepare"), self.turns.job():
                pre = self.children.ask(sb, prep, ctx.timeouts["load"], "benchmark", hb)
            for k, v in pre.timing.items():
                _add_phase(f"prepare.{k}", v)
            captures[who] = pre.captured
        with self.turns.with_ref(ref_lock):
            ref_pre = self.refs.do(ref, hb, prep, ctx.timeouts["load"])
        captures["base"] = ref_pre.captured
        if ref_pre.timing.get("flush-on-stream"):
            _add_phase("ref.prepare.flush-on-stream", 1)
        timed_children = [cand, ref, best]
        with self.turns.with_ref(ref_lock, timing=True):
            g0 = time.monotonic()
            ctx.sched.pin(timed_children, timed=True)  # the timed processes get cores of their own
            try:
                with _phase("interleave"):
                    return self.interleave(problem, dist, cand, ref, best, plan, hb, decisive, captures)
            finally:
                ctx.sched.pin(timed_children, timed=False)
                gpu_s[0] += time.monotonic() - g0

    def interleave(self, problem, dist: str, cand, ref, best, plan: dict, hb, decisive: bool = True,
                   captured: dict | None = None) -> TimedDistribution:
        """A/B(/C) blocks in one mode for all sides: candidate, baseline, (current best), repeated. On a GPU,
        `captured`: each side's Captured from its timing set's preparation (graph replay only if all did)."""
        ctx = self.ctx
        parties = [("cand", cand), ("base", ref), ("best", best)]
        captures = {}
        # Every repetition of every side runs on values of its own: an entry, handed out once per
        # benchmark and side, perturbs a pool set with draws from its key (timing_inputs). A candidate's
        # child draws its keys itself, each just before its call, and reports them; the reference child's
        # own repetitions take keys from this secret seed, which no candidate's child is handed. The
        # baseline's timed repetitions take the candidate's entries and keys: the same values, compared
        # call by call.
        noise_seed, counter = int.from_bytes(os.urandom(6), "little"), [0]

        def take(n: int) -> int:
            counter[0] += n
            return counter[0] - n

        if ctx.cuda:
            for who, sb in parties:
                if sb is None:
                    continue
                r = (captured or {}).get(who)  # none given: that side did not capture
                captures[who] = bool(r is not None and r.captured)
                if not captures[who]:
                    _add_phase(f"no-capture.{who}", 1)
            mode = choose_mode(list(captures.values()))
            # Slow baselines (mla_prefill's ~30 ms) get fewer repetitions per block: about
            # bench_block_ms of baseline time per block, never fewer than 5 (25 samples a side) ...
            probe = self.refs.do(ref, hb, msg.Time(reps=3, warmup=1, mode=mode, dist=dist, noise_seed=noise_seed,
                                                  first=take(4)), ctx.timeouts["time"])
            base_ms = median(probe.times)
            budget_ms = ctx.settings.bench_block_ms
            plan = {**plan, "reps": max(5, min(plan["reps"], int(budget_ms / max(base_ms, 1e-6))))}
            # ... and fewer blocks, never fewer than 3: about bench_total_ms of baseline time a distribution
            total_ms = ctx.settings.bench_total_ms
            plan["blocks"] = max(3, min(plan["blocks"], int(total_ms / (plan["reps"] * max(base_ms, 1e-6)))))
        else:
            mode = "back-to-back"  # the interpreter stand-in: the same steps, timed by perf_counter
        out = TimedDistribution(mode=mode if ctx.cuda else "interpreter", planned_blocks=plan["blocks"],
                                captures=captures, noise_seed=noise_seed,
                                check_seed=int.from_bytes(os.urandom(6), "little"))  # secret: drawn per benchmark
        for b in range(plan["blocks"]):
            if not another_block(b, out.best, out.cand, decisive):  # a clear loser stops after one block
                break
            warm = plan["warmup"] if b == 0 else 1
            cand_block, cand_keys = [], []
            for who, sb in parties:
                if sb is None:
                    continue
                # the side's fastest timed work so far bounds the device's time per repetition from below
                kw = dict(reps=plan["reps"], warmup=warm, mode=mode, keep_one=(who == "cand"), dist=dist,
                          device_floor_ms=min(out.times(who)) if out.times(who) else 0.0)
                if who == "base":
                    kw["noise_seed"] = noise_seed
                    if cand_block:  # the baseline runs on the candidate's block's entries, fingerprinted alike
                        kw.update(first=take(warm), entries=[c[0] for c in cand_block], keys=cand_keys,
                                  check_seed=out.check_seed)
                    else:
                        kw["first"] = take(warm + plan["reps"])
                    r = self.refs.do(sb, hb, msg.Time(**kw), ctx.timeouts["time"])
                    out.base_checks += r.checks
                    out.check_names = r.check_names or out.check_names  # the trusted side's
                else:
                    kw["first"] = take(warm + plan["reps"])
                    if who == "cand":
                        kw["check_seed"] = out.check_seed
                    r = self.children.ask(sb, msg.Time(**kw), ctx.timeouts["time"], "benchmark", hb)
                    if who == "cand":
                        cand_block, cand_keys = r.checks, r.keys
                        given = range(kw["first"] + warm, kw["first"] + warm + plan["reps"])
                        _check_entries(cand_block, len(r.times), list(given), cand_keys)
                        out.checks += cand_block
                out.times(who).extend(r.times)
            out.blocks = b + 1
        for who, sb in parties[:2]:
            # the candidate's also downloads its timed calls' kept outputs, in this turn (check_timed_outputs)
            req = msg.HostLatencyRequest(reps=plan["host_reps"], dist=dist, first=take(plan["host_reps"]),
                                         noise_seed=noise_seed if who == "base" else None, export=who == "cand")
            if who == "base":
                r = self.refs.do(sb, hb, req, ctx.timeouts["time"])
            else:
                r = self.children.ask(sb, req, ctx.timeouts["time"], "benchmark", hb)
            if who == "cand":
                out.cand_host, out.timed_jobs = r.walls, r.jobs
            else:
                out.base_host = r.walls
        _add_phase("timed-blocks", out.blocks)
        return out
