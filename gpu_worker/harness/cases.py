"""The verification of a loaded candidate on a list of cases at one shape (`CaseVerification`): its outputs
against the oracle (in the reference child), with the input-mutation, output-type, late-write,
determinism, degenerate-output and stale-output checks; and the other listed shapes a would-be best is
verified at next (`other_shapes`)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from gpu_worker import protocol as msg
from gpu_worker.harness.children import CandidateChildren, DeviceTurns
from gpu_worker.harness.compile import CompileStage
from gpu_worker.harness.context import StageContext
from gpu_worker.harness.references import ReferenceChildren
from gpu_worker.phases import add_phase as _add_phase
from gpu_worker.phases import phase as _phase
from gpu_worker.sandbox import Rejection


def other_shapes(problem, verified) -> list[str]:
    """The problem's shapes other than `verified`, cheapest first (by the bytes of their outputs): a
    kernel correct only at the shape it was verified at fails at the first of them."""

    def cost(shape) -> int:
        return sum(math.prod(o.shape) for o in problem.output_specs(shape).values())

    return [s.name for s in sorted((s for s in problem.shapes if s.name != verified.name), key=cost)]


def misshapen(handles: dict, specs: dict, names) -> str | None:
    """Why a call's exported outputs (name -> OutputHandle) cannot be compared with the oracle, else None:
    an output missing, or exported with another shape or dtype than the problem's spec. A buffer resized
    in place (a torch call's `out=`) is still the harness's object, so only its metadata shows it; the
    reference child compares like with like, and a mismatch reaching it would be its own failure, a
    harness error, where it is the candidate's."""
    for name in names:
        h, spec = handles.get(name), specs[name]
        if h is None:
            return f"output {name!r} was removed from out"
        if tuple(h.shape) != tuple(spec.shape) or h.dtype != spec.dtype:
            return (f"output {name!r} was left as {h.dtype}{list(h.shape)}, its buffer was {spec.dtype}"
                    f"{list(spec.shape)}")
    return None


def check_shapes(handles: dict, specs: dict, names, stage: str, call: str) -> None:
    """Rejects a call whose exported outputs are not the buffers' shape and dtype (see `misshapen`)."""
    why = misshapen(handles, specs, names)
    if why:
        raise Rejection(stage, f"output-type: run must write into the tensors it is given in out, as they are "
                        f"({call}: {why})")


@dataclass(frozen=True)
class CasesPassed:
    """A passing verification: the worst error over the cases and outputs, the baseline's worst own error,
    the smallest threshold and each distribution's (the smallest over its cases), and the log's lines."""

    rel_err: float
    baseline_err: float
    threshold: float
    thresholds: dict[str, float]
    log: str


class CaseVerification:
    """A loaded candidate's outputs on a list of cases at one shape, checked against the oracle in the
    reference child: the verify stage's work, and a would-be best's at a random shape."""

    def __init__(self, ctx: StageContext, turns: DeviceTurns, children: CandidateChildren,
                 refs: ReferenceChildren, compiler: CompileStage):
        self.ctx, self.turns, self.children, self.refs, self.compiler = ctx, turns, children, refs, compiler

    def verify(self, source, problem, shape, candidate_id, hb, source_key: str, cases: list | None = None,
               base_err: dict | None = None, hand_on: bool = True) -> CasesPassed:
        """Verification at `shape` on `cases` (default: the candidate's seeds from the pool, every
        distribution). `base_err`: per distribution, the baseline error the thresholds are taken from,
        instead of the baseline's own on each case (which is then not computed). `hand_on`: keep the
        passing child for the candidate's benchmark. A failing case raises its Rejection."""
        from gpu_worker.child import compared_outputs

        ctx = self.ctx
        names = compared_outputs(problem, shape, ctx.interpreter)
        specs = problem.output_specs(shape, cpu=ctx.interpreter)
        cases = cases or ctx.cases(problem, candidate_id)
        base_err_given = base_err
        key = ctx.child_key(problem.name, shape, source_key)
        sb, loaded_now = self.children.loaded_child(key, source, problem, shape, hb)
        handed_on = False
        stage = contextlib.ExitStack()  # the stage, counted by the device owner: upload to last comparison
        try:
            stage.enter_context(self.turns.stage())
            if loaded_now:  # a child loaded for this shape compiles first, outside the verification's turns
                self.compiler.compile_in(sb, problem, hb, "verify")
            listed = [(d, s) for d, s in cases]
            # a child kept for the benchmark reads its timing pools now too, mapped before the sets' jobs
            self.children.stage_cases(sb, listed, "verify", hb, ctx.timing_pools(problem) if hand_on else [])
            with _phase("reference"):  # the oracles, from the bank (computed there if missing)
                refs = self.refs.reference(problem, shape, cases, hb, baseline=base_err is None)
            # verification is untimed device work: one job for the stage's one command, which uploads the
            # cases, runs them, the rerun and the stale probe, and downloads the kept outputs (child/verify.py)
            with self.turns.job(), _phase("run-cases"):
                r = self.children.ask(sb, msg.Verify(cases=listed, stale=len(cases) > 1), ctx.timeouts["verify"],
                              "verify", hb)
            for k, v in r.timing.items():
                _add_phase(f"run-cases.{k}", v)
            for (dist, seed), ref, got in zip(cases, refs, r.cases):
                if got.hash_before != ref.hash:
                    raise Rejection("verify", f"harness error: candidate and reference inputs differ for {dist}/seed {seed}")
                if got.mutated:
                    raise Rejection("verify", f"input-mutation: the candidate modified its inputs {got.mutated} "
                                    f"({dist}, seed {seed}; compared bitwise with a copy taken before the call)")
                if not got.out_type_ok:
                    raise Rejection("verify", "output-type: run must write into the tensors it is given in out, in "
                                    "place; an entry of out was replaced or removed")
                check_shapes(got.outputs, specs, names, "verify", f"{dist}, seed {seed}")
            if r.rerun is not None:
                check_shapes(r.rerun, specs, names, "verify", "the determinism rerun")
            if r.stale is not None:
                check_shapes(r.stale.outputs, specs, names, "verify", "the stale-output probe")
            # The outputs' copies go to files and then onto the reference child's device, where they are
            # compared with the oracle.
            changed = r.changed + self.children.write_exports(sb, "verify", hb)
            if changed:
                raise Rejection("verify", f"late-write: outputs {changed} changed after the call returned "
                                "(work still running outside the call is not timed)")
            # Every comparison runs in the reference child, where the oracle already lives on the device;
            # the candidate's outputs reach it as files in the candidate's temp dir (see child/exports.py).
            jobs = [msg.CompareJob(case=(dist, seed), name=n, out=got.outputs[n])
                    for (dist, seed), got in zip(cases, r.cases) for n in names]
            if r.rerun is not None:
                jobs += [msg.CompareJob(name=n, out=r.rerun[n], other=r.cases[0].outputs[n]) for n in names]
            if r.stale is not None:
                jobs += [msg.CompareJob(case=tuple(cases[r.stale.case]), name=n, out=r.stale.outputs[n])
                         for n in names]
            with _phase("compare"):  # one call: the reference child reads each output file as it compares it
                cr = self.refs.call(problem, shape, hb, msg.Compare(jobs=jobs), ctx.timeouts["reference"])
            stage.close()
            cmp = iter(cr.results)  # in the order the jobs were listed
            for k, v in cr.timing.items():
                _add_phase(f"compare.{k}", v)
            log_tail = sb.log_tail()
            worst, base_worst, lines, thresholds, by_dist = 0.0, 0.0, [], [], {}
            for (dist, seed), ref in zip(cases, refs):
                base_err = ref.baseline_err if base_err_given is None else base_err_given[dist]
                thr = max(problem.tolerance_floor, problem.tolerance_alpha * base_err) if math.isfinite(base_err) \
                    else problem.tolerance_floor
                thresholds.append(thr)
                by_dist[dist] = min(thr, by_dist.get(dist, thr))
                base_worst = max(base_worst, base_err)
                for name in names:
                    c = next(cmp)
                    err = c.rel_err
                    lines.append(f"{dist:>8} seed {seed:>3} {name}: rel_err={err:.3e} baseline={base_err:.3e} threshold={thr:.3e}")
                    if c.nonfinite or math.isnan(err):
                        raise Rejection("verify", f"non-finite: {c.nonfinite} of {c.numel} elements of {name!r} are "
                                        f"NaN/Inf ({dist}, seed {seed}); outputs are NaN-poisoned, so unwritten elements "
                                        "show as NaN", "\n".join(lines))
                    if c.constant:
                        raise Rejection("verify", f"degenerate: output {name!r} is constant ({dist}, seed {seed})", "\n".join(lines))
                    if err > thr:
                        rej = Rejection("verify", f"wrong: rel_err {err:.3e} > threshold {thr:.3e} on {name!r} "
                                        f"({dist}, seed {seed}; baseline's own error {base_err:.3e})", "\n".join(lines))
                        rej.rel_err, rej.threshold = err, thr
                        raise rej
                    worst = max(worst, err)
            thr_min = min(thresholds)
            if r.rerun is not None:
                for name in names:
                    d = next(cmp).rel_err
                    lines.append(f"determinism rerun {name}: rel_diff={d:.3e}")
                    if not (d <= 0.1 * thr_min):
                        raise Rejection("verify", f"nondeterministic: rerun on fresh buffers differs by {d:.3e} on {name!r}",
                                        "\n".join(lines))
            if r.stale is not None:
                for name in names:
                    e = next(cmp).rel_err
                    lines.append(f"stale-output probe {name}: rel_err={e:.3e}")
                    if not (e <= thresholds[r.stale.case]):
                        raise Rejection("verify", f"output-cache: with the same buffers refilled with new inputs the "
                                        f"candidate returned stale/wrong {name!r} (rel_err {e:.3e})", "\n".join(lines))
            lines.append(log_tail)
            if hand_on:  # passed: the benchmark of this candidate gets this child, kernels loaded
                ctx.loaded.put(key, sb)
                handed_on = True
            return CasesPassed(rel_err=worst, baseline_err=base_worst, threshold=thr_min, thresholds=by_dist,
                               log="\n".join(lines))
        finally:
            stage.close()
            if not handed_on:
                sb.close()
