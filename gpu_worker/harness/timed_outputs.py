"""The checks of what timed calls returned: a candidate's report of its timed calls, the kept outputs of
timed calls against the baseline's on the same values, and every timed call's fingerprint."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpu_worker import protocol as msg
from gpu_worker.harness.cases import misshapen
from gpu_worker.harness.children import CandidateChildren
from gpu_worker.harness.context import StageContext
from gpu_worker.harness.references import ReferenceChildren
from gpu_worker.sandbox import Rejection, Sandbox

FINGERPRINT_SIGMAS = 6.0  # a timed call's projection may be off by this many bounds (see check_fingerprints)


@dataclass
class TimedDistribution:
    """One distribution's timing (BenchmarkStage.interleave), what the checks below read: each side's
    device times per timed repetition and host latencies; the candidate's fingerprints of its timed calls
    ([entry, [projection per output]]) and the baseline's on the same entries ([entry, [projection],
    [norm]]) with the outputs' names; the kept outputs of timed calls (`timed_jobs`), downloaded with the
    candidate's host latency; the blocks timed of those planned, the mode, the captures; and the seeds:
    the fingerprints' (secret to the candidate until its timing began) and the reference's noise."""

    mode: str
    planned_blocks: int
    captures: dict[str, bool]
    check_seed: int
    noise_seed: int
    blocks: int = 0
    cand: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    best: list[float] = field(default_factory=list)
    cand_host: list[float] = field(default_factory=list)
    base_host: list[float] = field(default_factory=list)
    checks: list = field(default_factory=list)
    base_checks: list = field(default_factory=list)
    check_names: list[str] = field(default_factory=list)
    timed_jobs: list = field(default_factory=list)

    def times(self, who: str) -> list[float]:
        """A side's device times: `cand`, `base` or `best`."""
        return {"cand": self.cand, "base": self.base, "best": self.best}[who]


def _check_entries(checks: list, reps: int, expected: list, keys: list | None = None) -> None:
    """A candidate child's report of its timed calls, before the baseline is run on the entries it names:
    one [entry, fingerprints] per timed call, the entries the ones the worker handed it, in order, and
    (given `keys`) one distinct key per call, which the baseline's values are drawn with."""
    from gpu_worker.timing_inputs import check_keys

    if not checks:
        return
    if keys is not None:
        try:
            check_keys(keys, reps)
        except ValueError as e:
            raise Rejection("benchmark", f"timed-output: the candidate's process reported keys unfit for its "
                            f"{reps} timed calls ({e}): its report was altered") from None
    ok = len(checks) == reps and all(
        isinstance(c, list) and len(c) == 2 and type(c[0]) is int and isinstance(c[1], list)
        and all(type(x) is float for x in c[1]) for c in checks) and [c[0] for c in checks] == list(expected)
    if not ok:
        raise Rejection("benchmark", f"timed-output: the candidate's process reported {len(checks)} timed calls "
                        f"for {reps} timings, or other entries than it was given: its report was altered")


class TimedOutputChecks:
    """The benchmark's checks of timed calls' outputs."""

    def __init__(self, ctx: StageContext, children: CandidateChildren, refs: ReferenceChildren):
        self.ctx, self.children, self.refs = ctx, children, refs

    def check_timed_outputs(self, problem, shape, dist: str, cand: Sandbox, hb,
                            res: TimedDistribution) -> tuple[str, list]:
        """The outputs of timed calls (one per block, picked at random by the candidate's child, every
        timed call NaN-poisoned, its inputs values of its own) against the baseline's outputs on the
        values that call ran on: a candidate that skips or cheapens its work while being timed, or
        replays a result fixed at capture or cached from an earlier call, is rejected here, within
        `timed_output_bound`. `res`: the distribution's timing, whose `timed_jobs` the candidate's child downloaded at its end; their files are written here, outside any
        turn."""
        from gpu_worker.child import compared_outputs

        names = set(compared_outputs(problem, shape, self.ctx.interpreter))
        self.children.write_exports(cand, "benchmark", hb)
        jobs = [j for j in res.timed_jobs if j.name in names]
        noise_seed = res.noise_seed
        if not jobs:
            raise Rejection("benchmark", "timed-output: no output of a timed call was kept (harness error)")
        specs = problem.output_specs(shape, cpu=self.ctx.interpreter)
        for job in jobs:
            why = misshapen({job.name: job.out}, specs, [job.name])
            if why:
                raise Rejection("benchmark", f"output-type: a timed call's {why} ({dist}, entry {job.entry})")
        bound = self.timed_output_bound(problem, shape)
        cr = self.refs.call(problem, shape, hb, msg.CompareTimed(jobs=jobs, dist=dist, noise_seed=noise_seed),
                            self.ctx.timeouts["reference"])
        worst = 0.0
        for job, c in zip(jobs, cr.results):
            err = c.rel_err
            if c.nonfinite or not math.isfinite(err) or err > bound:
                raise Rejection("benchmark", f"timed-output: the output {job.name!r} of a timed call ({dist}, "
                                f"entry {job.entry}) is {'non-finite' if c.nonfinite or not math.isfinite(err) else f'off by rel-RMS {err:.3e}'}"
                                f" against the baseline's on the same inputs (bound {bound:.3e}): work skipped, "
                                "cheapened, cached or fixed at capture while being timed")
            worst = max(worst, err)
        return f"{len(jobs)} outputs, worst rel-RMS {worst:.3e} vs bound {bound:.3e}", jobs

    def timed_output_bound(self, problem, shape) -> float:
        """rel-RMS a timed call's output may be off the baseline's on the same inputs: the verification
        threshold plus the baseline's own error, doubled (candidate and baseline each sit within their error
        of the oracle; the timing values are other inputs than the verification cases)."""
        errs = self.refs.baseline_errors(problem, shape)
        base_err = max(errs) if errs else problem.tolerance_floor
        return 2 * (max(problem.tolerance_floor, problem.tolerance_alpha * base_err) + base_err)

    def check_fingerprints(self, problem, shape, dist: str, res: TimedDistribution) -> str:
        """Every timed call of the candidate, not only the kept ones: its outputs' projections onto random
        vectors (drawn from a seed secret to the candidate until its timing began) against the baseline's,
        timed in the same block on the same pool entries and projected onto the same vectors. For an
        output off by e, the projection is off by a normal variable of standard deviation |e|; an honest
        output has |e| <= bound |baseline|, so a gap over FINGERPRINT_SIGMAS times that is a call whose
        work was skipped, or whose result is stale or cached per buffer (an honest output's gap is at most
        half a bound: 12 standard deviations short)."""
        checks, base = res.checks, res.base_checks
        if not checks:
            raise Rejection("benchmark", "timed-output: no fingerprint of a timed call came back (harness error)")
        if len(base) != len(checks) or any(int(c[0]) != int(b[0]) for c, b in zip(checks, base)):
            raise Rejection("benchmark", f"timed-output: the baseline's {len(base)} fingerprinted calls do not pair "
                            f"with the candidate's {len(checks)} (harness error)")
        names = res.check_names
        bound = self.timed_output_bound(problem, shape)
        worst = 0.0
        for n, ((entry, fps), (_, fbs, norms)) in enumerate(zip(checks, base)):
            if not len(fbs) == len(norms) == len(names):
                raise Rejection("benchmark", f"timed-output: the baseline's call {n + 1} has {len(fbs)} fingerprints "
                                f"for the outputs {names} (harness error)")
            if len(fps) != len(names):
                raise Rejection("benchmark", f"timed-output: timed call {n + 1} of {len(checks)} reported {len(fps)} "
                                f"fingerprints for the outputs {names}: its report was altered")
            for name, fc, fb, norm in zip(names, fps, fbs, norms):
                gap = abs(fc - fb) / max(bound * norm, 1e-30) if math.isfinite(fc) else math.inf
                if gap > FINGERPRINT_SIGMAS:
                    raise Rejection("benchmark", f"timed-output: timed call {n + 1} of {len(checks)} ({dist}, "
                                    f"entry {entry}): the output {name!r} does not match the baseline's on the same "
                                    f"inputs ({'non-finite' if not math.isfinite(fc) else f'projection off by {gap:.3g} bounds'}): "
                                    "work skipped, cheapened, cached or fixed at capture while being timed")
                worst = max(worst, gap)
        return f"{len(checks)} timed calls fingerprinted, worst {worst:.3g} of {FINGERPRINT_SIGMAS} bounds"
