"""The checks only a would-be best gets: verification at a random shape (`shape-specific`), and, in its
fresh-process benchmark, the profiler (CUPTI) cross-check of the judged device time and of the kernels
its work launched; and the preparation, ahead, of the listed shape its second verification goes to."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gpu_worker import protocol as msg
from gpu_worker.harness.children import CandidateChildren, DeviceTurns
from gpu_worker.harness.context import StageContext
from gpu_worker.harness.references import ReferenceChildren
from gpu_worker.harness.cases import CasesPassed, CaseVerification, other_shapes
from gpu_worker.phases import phase as _phase
from gpu_worker.sandbox import Rejection, Sandbox
from gpu_worker.timing import DistributionFigures, crosscheck, foreign_kernels
from workflows.contracts import EvalRequest

RANDOM_SLACK = 2.0  # a random shape's threshold, in multiples of the verified shape's (verify_random_shape)

# the verdicts of a verification that say the kernel's answer is wrong (at a random shape: shape-specific)
SHAPE_WRONG = ("wrong:", "non-finite:", "degenerate:", "nondeterministic:", "output-cache:", "late-write:")


@dataclass(frozen=True)
class ProfilerCheck:
    """The profiler cross-check's verdict (BestOnlyChecks.crosscheck): `foreign`, the kernels its work
    launched that are not the candidate's own Triton; `kernel_ms`, the profiler's per-call kernel time."""

    ok: bool
    text: str
    foreign: list[str]
    kernel_ms: float


def shape_to_prepare(problem, verified, prepared: set) -> str | None:
    """The listed shape a would-be best verified at `verified` is verified at next (the workflow takes the
    first of the report's other_shapes), unless `prepared` already holds it: its reference is worth
    preparing ahead, while the first candidates still compile and time."""
    others = other_shapes(problem, verified)
    if not others or (problem.name, others[0]) in prepared:
        return None
    return others[0]


class BestOnlyChecks:
    """The Evaluator's checks of a would-be best (see the module's docstring)."""

    def __init__(self, ctx: StageContext, turns: DeviceTurns, children: CandidateChildren,
                 refs: ReferenceChildren, verification: CaseVerification):
        self.ctx, self.turns, self.children, self.refs = ctx, turns, children, refs
        self.verification = verification
        self.prepared_shapes: set[tuple[str, str]] = set()  # (problem, shape) prepared ahead for a best's checks
        self._prepared_lock = threading.Lock()

    def prepare_next_shape(self, problem, verified, candidate_id: str) -> threading.Thread | None:
        """After a problem's first passing verification: its next listed shape's reference child, baseline
        and oracles for this candidate's cases, prepared in a background thread, once per worker and shape.
        The baseline's first call there (FLA autotunes) and the oracles take about a minute of host and
        device work that the first would-be best would otherwise wait for in its second verification; the
        device jobs go through the owner like any other. A failure leaves the shape to that verification."""
        with self._prepared_lock:
            self.prepared_shapes.add((problem.name, verified.name))  # its reference child serves it now
            name = shape_to_prepare(problem, verified, self.prepared_shapes) if self.ctx.cuda else None
            if name is None:
                return None
            self.prepared_shapes.add((problem.name, name))
        shape = problem.shape_named(name)
        cases = self.ctx.cases(problem, candidate_id)

        def run():
            t0 = time.monotonic()
            try:
                self.refs.reference(problem, shape, cases, None)
                print(f"prepared {problem.name} at {name} for a best's second verification in "
                      f"{time.monotonic() - t0:.1f} s", flush=True)
            except Exception as e:  # noqa: BLE001 - the verification that needs it prepares it again
                print(f"preparing {problem.name} at {name} failed after {time.monotonic() - t0:.1f} s: "
                      f"{type(e).__name__}: {e}", flush=True)

        t = threading.Thread(target=run, name="prepare-next-shape", daemon=True)
        t.start()
        return t

    def verify_random_shape(self, source, problem, verified, req: EvalRequest, hb, res: CasesPassed) -> tuple:
        """For a request with `random_shape` (a would-be best; `marathon verify`): the candidate verified
        once more, at a shape drawn from the problem's random space with the worker's secret generator, on
        inputs from secret seeds, one case per distribution: a kernel written for the listed shapes alone
        fails (`shape-specific`). The threshold is RANDOM_SLACK times the
        verified shape's, as the baseline is not run there (its first call at every new size would compile
        and autotune). Returns (the line for the log, the shape's name or None)."""
        shape = problem.random_shape(self.ctx.secret, cpu=self.ctx.interpreter)
        if shape is None:
            return "random shape: none (the problem has no random space)", None
        cases = [(d, self.ctx.secret.randrange(1 << 20, 1 << 40)) for d in problem.distributions]
        # each distribution's threshold, doubled: base_err such that max(floor, alpha * base_err) is that
        base_err = {d: RANDOM_SLACK * max(t, problem.tolerance_floor) / problem.tolerance_alpha
                    for d, t in res.thresholds.items()}
        self.refs.use_random(problem, shape)
        with _phase("random-shape"):
            try:
                self.refs.child(problem, shape, hb)  # a new reference child: its context in a device job
                r = self.verification.verify(source, problem, shape, req.candidate_id, hb, req.source_key,
                                             cases=cases, base_err=base_err, hand_on=False)
            except Rejection as rej:
                # only a wrong answer there is the shape's; a guard's refusal, or the device's memory taken by
                # the neighbours (retried alone), keeps its own reason
                if rej.stage != "verify" or not rej.reason.startswith(SHAPE_WRONG):
                    raise
                wrapped = Rejection(rej.stage, f"shape-specific: correct at {verified.name}, not at {shape.name}: "
                                    f"{rej.reason}", rej.log)
                wrapped.rel_err, wrapped.threshold = getattr(rej, "rel_err", None), getattr(rej, "threshold", None)
                raise wrapped from None
            finally:
                self.refs.release_random(problem, shape, cases)
        return (f"random shape {shape.name}: worst rel_err {r.rel_err:.3e} (threshold {r.threshold:.3e})",
                shape.name)

    def crosscheck(self, problem, worst: DistributionFigures, fresh: Sandbox, ref, ref_lock, names: list, hb,
                   gpu_s: list) -> ProfilerCheck:
        """For a new best, on the deciding distribution: profiler (CUPTI) kernel time per call agrees with
        the judged device time, for both sides (the candidate in a fresh process, the baseline in the
        reference child); the candidate's kernels appear in the trace and no other kernel launched by its work."""
        dist = worst.dist
        prep = self.ctx.timing_set_request(dist)
        with self.turns.job():
            self.children.ask(fresh, prep, self.ctx.timeouts["load"], "benchmark", hb)
        with self.turns.with_ref(ref_lock):
            self.refs.do(ref, hb, prep, self.ctx.timeouts["load"])
        with self.turns.with_ref(ref_lock, timing=True):
            g0 = time.monotonic()
            try:
                # values of their own for both (a profile takes 2 + 2 x reps entries): drawn by each child
                p = self.children.ask(fresh, msg.Profile(reps=10, dist=dist), self.ctx.timeouts["profile"],
                                      "benchmark", hb)
                pb = self.refs.do(ref, hb, msg.Profile(reps=10, dist=dist), self.ctx.timeouts["profile"])
            finally:
                gpu_s[0] += time.monotonic() - g0
        seen = [k for k in p.kernels if k in names]
        foreign = foreign_kernels(p.kernels, names)
        ok_c, allowed_c = crosscheck(worst.time_ms, p.kernel_ms_per_call, p.launches_per_call)
        ok_b, allowed_b = crosscheck(worst.baseline_ms, pb.kernel_ms_per_call, pb.launches_per_call)
        ok = bool(seen) and not foreign and ok_c and ok_b
        text = (f"[{dist}] candidate judged {worst.time_ms:.4g} ms vs profiler kernel time {p.kernel_ms_per_call:.4g} ms/call "
                f"in a fresh process (allowed gap {allowed_c:.3g} ms, {p.launches_per_call:.3g} launches per call); "
                f"baseline judged {worst.baseline_ms:.4g} ms vs {pb.kernel_ms_per_call:.4g} ms/call (allowed gap "
                f"{allowed_b:.3g} ms); candidate kernels in trace: {seen or 'NONE'}; kernels not the candidate's Triton: "
                f"{foreign or 'none'}")
        return ProfilerCheck(ok=ok, text=text, foreign=foreign, kernel_ms=p.kernel_ms_per_call)
