"""A candidate child's verification, one command for the whole stage (`verify`): the cases' upload, each
case (input hash, mutation, output type), the determinism rerun, the stale-output probe and the download of
the kept outputs, with each step's seconds in the reply. The comparisons with the oracle stay in the
reference child; the late-write check and the output files are `write_exports`, host work after it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_worker import protocol

if TYPE_CHECKING:
    from gpu_worker.child.core import ChildCore
    from gpu_worker.child.exports import ChildExports
    from gpu_worker.child.inputs import ChildInputs
    from gpu_worker.child.loading import ChildLoading
    from gpu_worker.child.timing import ChildTiming


class ChildVerification:
    """A candidate child's verification steps, run in order by `cmd_verify`. Built with the child's core,
    its inputs, its loading (the guarded call), its exports (the kept outputs) and its timing (whose
    `prepare` uploads the cases)."""

    PINNED = ("core", "inputs", "loading", "exports", "timing")  # by identity (ChildCore.pin_trusted)

    def __init__(self, core: ChildCore, inputs: ChildInputs, loading: ChildLoading, exports: ChildExports,
                 timing: ChildTiming):
        self.core, self.inputs, self.loading, self.exports, self.timing = core, inputs, loading, exports, timing

    # One command for the stage: the worker holds one untimed device job for all of it (a waiting timing
    # block waits for the whole verification, 1.9 s on average on the H200 for eight calls), where one job
    # per step cost a round trip and a queued turn each.

    def _tick(self, timing: dict, name: str, t0: float) -> float:
        """Seconds per verification step, reported to the worker's phase log."""
        timing[name] = timing.get(name, 0.0) + self.core.T["perf"]() - t0
        return self.core.T["perf"]()

    def cmd_verify(self, cases: list, rerun: bool = True, stale: bool = True):
        """The stage: the cases uploaded (ChildTiming.cmd_prepare), then each case on its fresh inputs with fresh,
        NaN-poisoned outputs, the determinism rerun (case 0 on fresh buffers) and, with two cases or more,
        the stale-output probe; then the outputs' copies downloaded for `write_exports`. Returns per case
        the inputs' hash before the call, the inputs it changed and its outputs' handles, and what changed
        type since its call (`changed`)."""
        self.exports.clear_pending()
        timing: dict[str, float] = {}
        try:
            for k, v in self.timing.cmd_prepare(cases=cases).timing.items():
                timing[f"prepare.{k}"] = v
            done, first = [], None
            for i, (dist, seed) in enumerate(cases):
                got, kept = self._verify_case(dist, seed, f"case{i}", timing, first is None)
                done.append(got)
                first = first or kept
            extra = {}
            if rerun:
                t = self.core.T["perf"]()
                extra["rerun"] = self._verify_rerun(cases[0])
                self._tick(timing, "rerun", t)
            if stale and len(cases) > 1:
                t = self.core.T["perf"]()
                extra["stale"] = self._verify_stale(first[0], cases[1])
                self._tick(timing, "stale", t)
            ex = self.exports._download_verified()
            timing.update(ex.timing)
        finally:
            self.inputs.prefetched = {}
        self.core.ran = True
        return protocol.Verified(cases=done, **extra, changed=ex.changed,
                                 timing={k: round(x, 4) for k, x in timing.items()})

    def _verify_case(self, dist: str, seed: int, tag: str, timing: dict, first: bool):
        """One case: the inputs' hash before the call, whether the call changed them, whether it wrote the
        buffers it was given rather than replacing them, and its outputs' handles (copied right after the
        call). Returns that and the (inputs, outputs) it ran on."""
        t = self.core.T["perf"]()
        inputs = self.inputs._inputs(dist, seed)
        t = self._tick(timing, "inputs", t)
        h0 = self.inputs._hash(inputs)
        pristine = self.inputs._pristine(inputs)
        outs = self.core._outputs()
        given = dict(outs)  # the harness's buffers: the call writes into them, it does not replace them
        mine = dict(inputs)
        t = self._tick(timing, "hash-copy", t)
        self.loading._call(inputs, outs, guarded=True)
        t = self._tick(timing, "first-call" if first else "call", t)
        # the tensors it was given are checked, and probed again, whatever the call put in its dict
        inputs.clear()
        inputs.update(mine)
        mutated = self.inputs._mutated(inputs, pristine)
        del pristine
        t = self._tick(timing, "hash-copy", t)
        case = protocol.VerifiedCase(
            dist=dist, seed=seed, hash_before=h0, mutated=mutated, outputs=self.exports._export(outs, tag),
            out_type_ok=outs.keys() == given.keys() and all(outs[k] is given[k] for k in given))
        self._tick(timing, "export", t)
        return case, (inputs, outs)

    def _verify_rerun(self, case: tuple) -> dict:
        """The determinism rerun: `case` again, on fresh buffers (copies of its prefetched inputs)."""
        inputs = self.inputs._inputs(*case)
        outs = self.core._outputs()
        self.loading._call(inputs, outs, guarded=True)
        return self.exports._export(outs, "rerun")

    def _verify_stale(self, inputs0: dict, case1: tuple) -> protocol.StaleProbe | None:
        """The stale-output probe: case 0's input buffers (same pointers) now hold case 1's contents, on
        fresh outputs; a candidate that caches its outputs by pointer returns case 0's again."""
        fresh = self.inputs._inputs(*case1)
        if not all(getattr(fresh[k], "shape", None) == getattr(inputs0[k], "shape", None) for k in fresh):
            return None
        for k, x in fresh.items():
            if hasattr(x, "copy_"):
                self.core.T["copy_"](inputs0[k], x)
            else:
                inputs0[k] = x
        outs = self.core._outputs()
        self.loading._call(inputs0, outs, guarded=True)
        return protocol.StaleProbe(case=1, outputs=self.exports._export(outs, "stale"))
