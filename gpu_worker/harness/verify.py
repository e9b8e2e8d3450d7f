"""The verify stage: the candidate's outputs on the cases of its seeds against the oracle
(harness.cases.CaseVerification), then, for a would-be best, a random shape (harness.best_checks)."""

from __future__ import annotations

import time

from gpu_worker.harness.best_checks import BestOnlyChecks
from gpu_worker.harness.cases import CaseVerification, other_shapes
from gpu_worker.harness.children import CandidateChildren
from gpu_worker.harness.context import StageContext
from gpu_worker.phases import Heartbeat
from gpu_worker.phases import waiting_heartbeat as _waiting_heartbeat
from gpu_worker.sandbox import Rejection, SandboxFailure
from workflows.contracts import EvalRequest, VerifyReport


class VerifyStage:
    """The Evaluator's verify stage: the candidate's cases at its shape (CaseVerification), then, for a
    would-be best, the best-only checks' random shape; the first pass prepares the next listed shape."""

    def __init__(self, ctx: StageContext, children: CandidateChildren, verification: CaseVerification,
                 best: BestOnlyChecks):
        self.ctx, self.children, self.verification, self.best = ctx, children, verification, best

    def verify(self, req: EvalRequest, hb: Heartbeat = None, prepare_next: bool = True) -> VerifyReport:
        """`prepare_next`: after the problem's first passing verification, prepare the shape a would-be best
        is verified at next (BestOnlyChecks.prepare_next_shape); the canaries, which crown nothing, do not."""
        return self.children.retried_alone(lambda: self._verify_once(req, hb, prepare_next))

    def _verify_once(self, req: EvalRequest, hb: Heartbeat = None, prepare_next: bool = True) -> VerifyReport:
        _waiting_heartbeat(hb)
        ctx = self.ctx
        t0 = time.monotonic()
        source = ctx.source(req.source_key)
        try:
            problem, shape = ctx.checked(req, source)
            res = self.verification.verify(source, problem, shape, req.candidate_id, hb, req.source_key)
            if prepare_next:
                self.best.prepare_next_shape(problem, shape, req.candidate_id)
            probe, drawn = self.best.verify_random_shape(source, problem, shape, req, hb, res) if req.random_shape \
                else ("", None)
            return VerifyReport(ok=True, rel_err=res.rel_err, baseline_rel_err=res.baseline_err,
                                threshold=res.threshold, interpreter=ctx.interpreter,
                                log_key=ctx.log(res.log + "\n" + probe), seconds=time.monotonic() - t0,
                                other_shapes=other_shapes(problem, shape) if ctx.cuda else [], random_shape=drawn)
        except Rejection as rej:
            return VerifyReport(ok=False, stage=rej.stage, reason=rej.reason[:4000], interpreter=ctx.interpreter,
                                rel_err=getattr(rej, "rel_err", None), threshold=getattr(rej, "threshold", None),
                                log_key=ctx.log(rej.reason + "\n" + rej.log), seconds=time.monotonic() - t0)
        except SandboxFailure as f:
            return VerifyReport(ok=False, stage="sandbox", reason=f"{f.kind}: {f.reason}", interpreter=ctx.interpreter,
                                log_key=ctx.log(f"{f.kind}: {f.reason}\n{f.log}"), seconds=time.monotonic() - t0)
