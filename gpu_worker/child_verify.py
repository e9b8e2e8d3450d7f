"""A candidate child's verification checks, one command per step: each case (input hash, mutation, output
type), the determinism rerun, the stale-output probe, and the reply that gathers them."""

from __future__ import annotations

from gpu_worker import protocol
from gpu_worker.child_core import Refused


class ChildVerification:
    """A candidate child's verification steps."""

    # Verification runs as one call per step (each case, the determinism rerun, the stale-output probe), so
    # that each step is a device job of its own: a waiting timing block waits for the running jobs to end,
    # and one job for all eight calls lasted 1.9 s on average on the H200.

    @staticmethod
    def _out_of_order(step: str) -> Refused:
        return Refused("exception", f"verification step out of order: {step}")

    def _tick(self, name: str, t0: float) -> float:
        """Seconds per verification step, reported to the worker's phase log."""
        tm = self._verifying["timing"]
        tm[name] = tm.get(name, 0.0) + self.T["perf"]() - t0
        return self.T["perf"]()

    def cmd_verify_case(self, cases: list, i: int):
        """Case i of `cases`: the candidate runs on the case's fresh inputs with fresh, NaN-poisoned outputs;
        the inputs' hash before the call, whether the call changed them, and the outputs' handles are kept
        for `verify_reply`. Outputs are copied right after the call; `export` and `write_exports`, which
        the worker calls after the reply, turn the copies into the handles' files. Case 0 starts a new
        verification; a later case must follow the one before it."""
        if i == 0:
            self._pending = []
            self._verifying = {"cases": [], "timing": {}, "first": None, "extra": {}}
        v = self._verifying
        if v is None or len(v["cases"]) != i or v["extra"]:
            raise self._out_of_order(f"case {i}")
        dist, seed = cases[i]
        t = self.T["perf"]()
        inputs = self._inputs(dist, seed)
        t = self._tick("inputs", t)
        h0 = self._hash(inputs)
        pristine = self._pristine(inputs)
        outs = self._outputs()
        given = dict(outs)  # the harness's buffers: the call writes into them, it does not replace them
        t = self._tick("hash-copy", t)
        self._call(inputs, outs, guarded=True)
        t = self._tick("first-call" if v["first"] is None else "call", t)
        mutated = self._mutated(inputs, pristine)
        del pristine
        t = self._tick("hash-copy", t)
        v["cases"].append(protocol.VerifiedCase(
            dist=dist, seed=seed, hash_before=h0, mutated=mutated, outputs=self._export(outs, f"case{i}"),
            out_type_ok=outs.keys() == given.keys() and all(outs[k] is given[k] for k in given)))
        self._tick("export", t)
        if v["first"] is None:
            v["first"] = (inputs, outs)
        return protocol.Empty()

    def cmd_verify_rerun(self, cases: list):
        """The determinism rerun: case 0 again, on fresh buffers (copies of its prefetched inputs)."""
        v = self._verifying
        if v is None or not v["first"]:
            raise self._out_of_order("rerun before case 0")
        t = self.T["perf"]()
        inputs = self._inputs(*cases[0])
        outs = self._outputs()
        self._call(inputs, outs, guarded=True)
        v["extra"]["rerun"] = self._export(outs, "rerun")
        self._tick("rerun", t)
        return protocol.Empty()

    def cmd_verify_stale(self, cases: list):
        """The stale-output probe: case 0's input buffers (same pointers) now hold case 1's contents, on
        fresh outputs; a candidate that caches its outputs by pointer returns case 0's again."""
        v = self._verifying
        if v is None or not v["first"] or len(cases) < 2:
            raise self._out_of_order("stale probe")
        t = self.T["perf"]()
        inputs0, _ = v["first"]
        fresh = self._inputs(*cases[1])
        if all(getattr(fresh[k], "shape", None) == getattr(inputs0[k], "shape", None) for k in fresh):
            for k, x in fresh.items():
                if hasattr(x, "copy_"):
                    self.T["copy_"](inputs0[k], x)
                else:
                    inputs0[k] = x
            outs = self._outputs()
            self._call(inputs0, outs, guarded=True)
            v["extra"]["stale"] = protocol.StaleProbe(case=1, outputs=self._export(outs, "stale"))
        self._tick("stale", t)
        return protocol.Empty()

    def cmd_verify_reply(self):
        """Host work only: what the steps gathered (cases, and "rerun" / "stale" where they ran), with their
        timings. The verification's inputs are dropped here."""
        v = self._verifying
        if v is None:
            raise self._out_of_order("no verification")
        reply = protocol.Verified(cases=v["cases"], **v["extra"],
                                  timing={k: round(x, 4) for k, x in v["timing"].items()})
        self._verifying = None
        self._prefetched = {}
        self.ran = True
        return reply
