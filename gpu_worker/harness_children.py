"""The Evaluator's children and the device holds around their commands: the reference child per (problem,
shape) and its cached cases, candidate children loaded, handed on and parked, each command's reply turned
into a verdict, and the GPU gate's sides and memory admission each command runs under."""

from __future__ import annotations

import contextlib
import math
import threading
import time

from gpu_worker import protocol as msg
from gpu_worker.phases import Heartbeat
from gpu_worker.phases import add_phase as _add_phase
from gpu_worker.phases import phase as _phase
from gpu_worker.sandbox import Rejection, Sandbox, SandboxFailure


def _mem_shape(shape) -> str:
    """The shape's name in device-memory admission: random shapes share one, learned as the largest."""
    from baselines.problem import RANDOM_SHAPE

    return "random" if shape.name.startswith(RANDOM_SHAPE) else shape.name


def _nbytes(handle: msg.OutputHandle) -> tuple[int, int]:
    """(bytes, elements) of an exported output."""
    import torch

    n = math.prod(handle.shape)
    return n * getattr(torch, handle.dtype).itemsize, n


class EvaluatorChildren:
    """The Evaluator's access to its children, each command under its device hold."""

    def _ref(self, problem, shape, hb) -> tuple[Sandbox, threading.Lock, dict]:
        key = (problem.name, shape.name)
        with self._refs_lock:
            entry = self._refs.get(key)
            if entry and not entry[0].alive():
                entry = None
            if entry is None:
                sb = self.sched.spawn("reference", self.interpreter)
                entry = (sb, threading.Lock(), {})
                self._refs[key] = entry
        sb, lock, info = entry
        if not info:
            try:
                # a new child's CUDA context is untimed device work (the gate's shared side); Triton's keys and
                # the problem's setup (imports, the baseline's construction) are host work, outside the gate
                with self._with_ref(lock):
                    self._ref_do(sb, hb, msg.CudaInit(), self.timeouts["load"])
                with lock:
                    if not info:
                        self._ref_do(sb, hb, msg.WarmTriton(), self.timeouts["load"])
                        info["setup"] = self._ref_do(sb, hb, msg.Setup(problem=problem.name, shape=shape.name),
                                                     self.timeouts["load"])
            except RuntimeError:
                sb.close()
                raise
        return entry

    def _ref_call(self, problem, shape, hb, request: msg.Request, timeout, gate: str = "shared") -> msg.Result:
        """One call to the reference child with its lock and the GPU gate's `gate` side ("shared" or
        "exclusive"; see _with_ref)."""
        sb, lock, _ = self._ref(problem, shape, hb)
        with self._with_ref(lock, gate):
            return self._ref_do(sb, hb, request, timeout)

    @staticmethod
    def _ref_do(sb: Sandbox, hb, request: msg.Request, timeout) -> msg.Result:
        """The call itself, its lock and gate side already held; its result."""
        t = time.monotonic()
        try:
            r = sb.call(request, timeout, hb)
        except SandboxFailure as f:
            # the trusted child failed (or was killed by an interrupted call, Sandbox.call): a harness error,
            # which the activity's retry meets with a new reference child, never the candidate's rejection
            raise RuntimeError(f"reference process {request.cmd} failed: {f}") from f
        _add_phase(f"ref.{request.cmd}", time.monotonic() - t)
        if not r.ok:
            raise RuntimeError(f"reference process {request.cmd} failed: {r.failure.kind}: {r.failure.error}\n"
                               f"{r.failure.traceback}")
        return r.result

    def reference(self, problem, shape, cases, hb, gate: str = "shared",
                  baseline: bool = True) -> list[msg.ReferenceCase]:
        """Per case: the inputs' fingerprint and the baseline's own error (NaN without `baseline`), the oracle
        left on the reference child's device for the comparisons; each case computed once."""
        def key(c):
            return (problem.name, shape.name, c[0], c[1])

        def absent(cs):
            with self._ref_meta_lock:
                return [c for c in cs if key(c) not in self._ref_meta]

        missing = absent(cases)
        if missing:
            sb, lock, _ = self._ref(problem, shape, hb)
            with lock:  # the cases' inputs generated (and banked) or read: host work, before the gate
                if absent(missing):
                    self._ref_do(sb, hb, msg.Stage(cases=absent(missing)), self.timeouts["reference"])
            with self._with_ref(lock, gate):
                # read again with the child's lock held: another caller (the warm-up, an early verification)
                # may have computed these cases while this one waited for it, and each case is computed once
                missing = absent(missing)
                if missing:
                    r = self._ref_do(sb, hb, msg.Reference(cases=missing, baseline=baseline),
                                     self.timeouts["reference"])
                    with self._ref_meta_lock:
                        for c, res in zip(missing, r.cases):
                            self._ref_meta[key(c)] = res
        with self._ref_meta_lock:
            return [self._ref_meta[key(c)] for c in cases]

    def _carried(self) -> int:
        """Device bytes outside the admitted stages: reference children, children waiting between stages,
        and a CUDA context per live child."""
        with self._refs_lock:
            refs = sum(sb.reserved for sb, _, _ in self._refs.values())
        return refs + self.loaded.reserved() + Sandbox.live * Sandbox.CONTEXT

    def _hold(self, problem, shape, stage: str):
        """A stage's device-memory admission (nothing to admit on the CPU)."""
        return self.mem.hold((problem.name, _mem_shape(shape), stage)) if self.mem else contextlib.nullcontext()

    def _learn(self, problem, shape, stage: str, children: list, jobs: list = ()) -> None:
        """The stage's footprint, learned for the next admission: the children's peak since their last
        report plus what one comparison adds in the reference child (an output read onto its device and
        its fp64 copy; the comparisons read their outputs one at a time)."""
        if not self.mem:
            return
        peak = sum(self._memory_peak(sb) for sb in children if sb is not None and sb.alive())
        sizes = [_nbytes(h) for j in jobs for h in (j.out, getattr(j, "other", None)) if h]
        staged = max((b + 8 * n for b, n in sizes), default=0)
        self.mem.learn((problem.name, _mem_shape(shape), stage), peak + staged)

    @staticmethod
    def _memory_peak(sb: Sandbox) -> int:
        r = sb.call(msg.Mem(), 60)
        return r.result.peak if r.ok else 0

    def _ask(self, sb: Sandbox, request: msg.Request, timeout: float, stage: str, hb) -> msg.Result:
        """One command of a candidate child; its result, or the Rejection its failure is (_check_reply)."""
        r = sb.call(request, timeout, hb)
        self._check_reply(r, stage, sb)
        return r.result

    @staticmethod
    def _check_reply(r: msg.Reply, stage: str, sb: Sandbox):
        """A candidate child's reply as a verdict: a guard's violation, then a failed command, is a Rejection."""
        if r.violations:
            rule, detail = r.violations[0]
            raise Rejection("rules", f"{rule}: {detail} (run-time guard)", sb.log_tail())
        if not r.ok:
            kind = r.failure.kind
            st = {"cuda-error": "sandbox", "oom": "sandbox", "contract": "rules"}.get(kind, stage)
            raise Rejection(st, f"{kind}: {r.failure.error}", r.failure.traceback + "\n" + sb.log_tail())

    def _shared(self):
        """The GPU gate's shared side (device work that is not timed; see TimedLock)."""
        return self.gpu_lock.shared() if self.cuda else contextlib.nullcontext()

    @contextlib.contextmanager
    def _with_ref(self, lock: threading.Lock, gate: str = "shared"):
        """A reference child's lock together with the gate's `gate` side. Shared: TimedLock.shared(also=),
        which never holds one while waiting for the other. Exclusive: the gate first, then the lock, which
        is then held at most by a call that is giving it back (it cannot have the shared side)."""
        if not self.cuda:
            with lock:
                yield
        elif gate == "exclusive":
            with self._exclusive():
                t = time.monotonic()
                with lock:
                    _add_phase("ref-wait", time.monotonic() - t)
                    yield
        else:
            with self.gpu_lock.shared(also=lock):
                yield

    def _exclusive(self):
        """The GPU gate's exclusive side (timed work); nothing to exclude on the CPU."""
        return self.gpu_lock if self.cuda else contextlib.nullcontext()

    def _download(self, sb: Sandbox, request: msg.Export | msg.ExportTimed, stage: str, hb):
        """A candidate child's kept outputs (`Export` after verification, `ExportTimed` after timing):
        downloaded under the gate's shared side, then written to its files without it. Returns the
        download's result and the outputs the late-write check found changed (verification's only)."""
        with _phase("export"), self._shared():
            ex = self._ask(sb, request, self.timeouts["verify"], stage, hb)
        with _phase("export-write"):  # the late-write check and the files: host work, no gate
            wr = self._ask(sb, msg.WriteExports(), self.timeouts["verify"], stage, hb)
        return ex, (ex.changed if isinstance(ex, msg.Exported) else []) + wr.changed

    def _cuda_init(self, sb: Sandbox, hb: Heartbeat = None) -> None:
        """A candidate child's CUDA context, made under the gate's shared side (once per child); then
        Triton's per-process keys, host work, outside the gate."""
        with self._shared():
            self._ask(sb, msg.CudaInit(), self.timeouts["load"], "sandbox", hb)
        self._ask(sb, msg.WarmTriton(), self.timeouts["load"], "sandbox", hb)

    def _load(self, sb: Sandbox, source: str, problem, shape, hb) -> msg.Loaded:
        from gpu_worker.sandbox import triton_cache_dir

        if self.cuda:
            self._cuda_init(sb, hb)  # a spare has both already: then these are two round trips
            if self.mem and self.mem.total is None:
                m = sb.call(msg.Mem(), 60)
                self.mem.learn(None, 0, m.result.total if m.ok else None)
        return self._ask(sb, msg.Load(source=source, problem=problem.name, shape=shape.name, write_roots=[],
                                      trusted_roots=[str(triton_cache_dir())]), self.timeouts["load"], "compile", hb)

    def _loaded_child(self, key, source: str, problem, shape, hb) -> tuple[Sandbox, msg.Loaded | None]:
        """The child the previous stage left with this candidate loaded, else a fresh one loaded now.
        Returns it with the load's result (None when handed on: loading happened in the earlier stage)."""
        sb = self.loaded.take(key)
        if sb is not None:
            _add_phase("handed-on", 1)
            return sb, None
        sb = self.pool.acquire()
        try:
            with _phase("load"):
                return sb, self._load(sb, source, problem, shape, hb)
        except BaseException:
            sb.close()
            raise

    def _stage(self, sb: Sandbox, cases: list, stage: str, hb) -> None:
        """The cases' inputs into the child's host memory (bank reads, or generation): before the gate."""
        with _phase("stage"):
            self._ask(sb, msg.Stage(cases=cases), self.timeouts["load"], stage, hb)

    @staticmethod
    def _park(sb: Sandbox) -> bool:
        """A child about to wait for a later benchmark drops its timing sets (child_timing: park); False if it
        cannot (then it is closed, not kept)."""
        try:
            return sb.alive() and sb.call(msg.Park(), 60).ok
        except SandboxFailure:
            return False
