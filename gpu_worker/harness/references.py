"""The reference children (`ReferenceChildren`): one per (problem, shape), trusted code only, each serving
one call at a time under its lock; the cases each computed once (the inputs' fingerprint and the
baseline's own error here, the oracle on the child's device); the device's ceilings, measured once; and a
random shape's child, counted by the verifications that use it."""

from __future__ import annotations

import collections
import math
import threading
import time

from gpu_worker import protocol as msg
from gpu_worker.harness.children import DeviceTurns, ReferenceOutOfMemory
from gpu_worker.harness.context import StageContext
from gpu_worker.phases import add_phase as _add_phase
from gpu_worker.sandbox import Sandbox, SandboxFailure

#: a reference child asked to exit may first write the cache entries it queued (KDA's are GBs at some shapes)
REFERENCE_GRACE_S = 60.0


class ReferenceChildren:
    """The reference child of each (problem, shape), its cases and the ceilings (see the module's docstring)."""

    def __init__(self, ctx: StageContext, turns: DeviceTurns):
        self.ctx, self.turns = ctx, turns
        self.children: dict[tuple, tuple[Sandbox, threading.Lock, dict]] = {}
        self.lock = threading.Lock()  # over `children` and `random_users`
        # per (problem, shape, dist, seed): the inputs' fingerprint and the baseline's own error. Small and
        # deterministic, so never evicted; the oracle itself lives in the reference child (gpu_worker/child/reference.py).
        self.meta: dict[tuple, msg.ReferenceCase] = {}
        self.meta_lock = threading.Lock()
        self.random_users: collections.Counter = collections.Counter()  # (problem, random shape) -> verifications
        self.ceilings: msg.Ceilings | None = None
        self._ceilings_lock = threading.Lock()  # the ceilings are measured once

    def close(self) -> None:
        with self.lock:
            for sb, _, _ in self.children.values():
                sb.close(graceful=True, grace_s=REFERENCE_GRACE_S)
            self.children.clear()

    def child(self, problem, shape, hb) -> tuple[Sandbox, threading.Lock, dict]:
        """The reference child of (problem, shape), started and set up on first use; with its lock and its
        setup's result (`info["setup"]`)."""
        key = (problem.name, shape.name)
        with self.lock:
            entry = self.children.get(key)
            if entry and not entry[0].alive():
                entry = None
            if entry is None:
                sb = self.ctx.sched.spawn("reference", self.ctx.interpreter, self.ctx.settings)
                entry = (sb, threading.Lock(), {})
                self.children[key] = entry
        sb, lock, info = entry
        if not info:
            try:
                # a new child's CUDA context is an untimed device job; Triton's keys and the problem's setup
                # (imports, the baseline's construction) are host work, outside any turn
                with self.turns.with_ref(lock):
                    self.do(sb, hb, msg.CudaInit(), self.ctx.timeouts["load"])
                with lock:
                    if not info:
                        self.do(sb, hb, msg.WarmTriton(), self.ctx.timeouts["load"])
                        info["setup"] = self.do(sb, hb, msg.Setup(problem=problem.name, shape=shape.name),
                                                self.ctx.timeouts["load"])
            except RuntimeError:
                sb.close()
                raise
        return entry

    def call(self, problem, shape, hb, request: msg.Request, timeout, timing: bool = False) -> msg.Result:
        """One call to the reference child with its lock and a device turn: a timing block's with `timing`,
        else an untimed job's (see DeviceTurns.with_ref)."""
        sb, lock, _ = self.child(problem, shape, hb)
        with self.turns.with_ref(lock, timing):
            return self.do(sb, hb, request, timeout)

    @staticmethod
    def do(sb: Sandbox, hb, request: msg.Request, timeout) -> msg.Result:
        """The call itself, its lock and device turn already held; its result."""
        t = time.monotonic()
        try:
            r = sb.call(request, timeout, hb)
        except SandboxFailure as f:
            # the trusted child failed (or was killed by an interrupted call, Sandbox.call): a harness error,
            # which the activity's retry meets with a new reference child, never the candidate's rejection
            raise RuntimeError(f"reference process {request.cmd} failed: {f}") from f
        _add_phase(f"ref.{request.cmd}", time.monotonic() - t)
        if not r.ok and r.failure.kind == "oom":
            raise ReferenceOutOfMemory(f"oom: the reference process's {request.cmd}: {r.failure.error[-300:]}")
        if not r.ok:
            raise RuntimeError(f"reference process {request.cmd} failed: {r.failure.kind}: {r.failure.error}\n"
                               f"{r.failure.traceback}")
        return r.result

    def stage_timing_set(self, sb: Sandbox, lock, hb, dist: str) -> None:
        """`dist`'s timing-set pool drawn by the reference child ahead of the job that makes the set: host work
        under the child's lock alone (nothing where it holds the set already)."""
        with lock:
            self.do(sb, hb, self.ctx.timing_set_staging(dist), self.ctx.timeouts["load"])

    def reference(self, problem, shape, cases, hb, timing: bool = False,
                  baseline: bool = True) -> list[msg.ReferenceCase]:
        """Per case: the inputs' fingerprint and the baseline's own error (NaN without `baseline`), the oracle
        left on the reference child's device for the comparisons; each case computed once. `timing`: in a
        timing block's turn (the warm-up's, with nothing else on the device), else an untimed job's."""
        def key(c):
            return (problem.name, shape.name, c[0], c[1])

        def absent(cs):
            with self.meta_lock:
                return [c for c in cs if key(c) not in self.meta]

        missing = absent(cases)
        if missing:
            sb, lock, _ = self.child(problem, shape, hb)
            with lock:  # the cases' inputs generated (and banked) or read: host work, before the device turn
                if absent(missing):
                    self.do(sb, hb, msg.Stage(cases=absent(missing)), self.ctx.timeouts["reference"])
            with self.turns.with_ref(lock, timing):
                # read again with the child's lock held: another caller (the warm-up, an early verification)
                # may have computed these cases while this one waited for it, and each case is computed once
                missing = absent(missing)
                if missing:
                    r = self.do(sb, hb, msg.Reference(cases=missing, baseline=baseline),
                                self.ctx.timeouts["reference"])
                    with self.meta_lock:
                        for c, res in zip(missing, r.cases):
                            self.meta[key(c)] = res
        with self.meta_lock:
            return [self.meta[key(c)] for c in cases]

    def baseline_errors(self, problem, shape) -> list[float]:
        """The baseline's own (finite) errors on the cases computed at (problem, shape)."""
        with self.meta_lock:
            return [m.baseline_err for k, m in self.meta.items()
                    if k[:2] == (problem.name, shape.name) and math.isfinite(m.baseline_err)]

    def ensure_baseline_errors(self, problem, shape, cases, hb) -> list[float]:
        """`baseline_errors`, measured now on `cases` (with their oracles) where none is known at (problem,
        shape): a benchmark on a worker that verified nothing there (a restart, a best re-measured) bounds
        its timed calls by the baseline's measured error, never by a guess."""
        errs = self.baseline_errors(problem, shape)
        if not errs:
            self.reference(problem, shape, cases, hb, baseline=True)
            errs = self.baseline_errors(problem, shape)
        return errs

    def case_timing(self, problem, shape, cases) -> dict[str, float]:
        """Where the computation of `cases` at (problem, shape) went (inputs, oracle, baseline), summed."""
        out: dict[str, float] = {}
        with self.meta_lock:
            for d, seed in cases:
                meta = self.meta.get((problem.name, shape.name, d, seed))
                for k, v in (meta.timing if meta is not None else {}).items():
                    out[k] = out.get(k, 0.0) + v
        return out

    def ensure_ceilings(self, problem, shape, hb) -> msg.Ceilings | None:
        """The device's bandwidth and matmul rate, measured once in a timing block; None on the CPU."""
        if not self.ctx.cuda:
            return None
        if self.ceilings is None:
            with self._ceilings_lock:
                if self.ceilings is None:
                    self.ceilings = self.call(problem, shape, hb, msg.MeasureCeilings(), 300, timing=True)
        return self.ceilings

    def close_child(self, problem_name: str, shape_name: str) -> bool:
        """Close the reference child of (problem, shape), if one runs; a later call starts another."""
        with self.lock:
            entry = self.children.pop((problem_name, shape_name), None)
        if entry is not None:
            with entry[1]:  # after the call it may be serving
                entry[0].close(graceful=True, grace_s=REFERENCE_GRACE_S)
        return entry is not None

    def use_random(self, problem, shape) -> None:
        """A verification at a random shape begins: two may draw the same shape, whose child serves both."""
        with self.lock:
            self.random_users[(problem.name, shape.name)] += 1

    def release_random(self, problem, shape, cases: list) -> None:
        """A random shape's records of `cases`, dropped once its verification is over, and its reference
        child once no other verification uses it."""
        key = (problem.name, shape.name)
        with self.lock:
            self.random_users[key] -= 1
            entry = self.children.pop(key, None) if self.random_users[key] <= 0 else None
            if self.random_users[key] <= 0:
                del self.random_users[key]
        if entry is not None:
            entry[0].close()
        with self.meta_lock:
            for d, seed in cases:
                self.meta.pop((problem.name, shape.name, d, seed), None)
