"""The Evaluator's children and the device turns around their commands: the reference child per (problem,
shape) and its cached cases, candidate children loaded, handed on and parked, each command's reply turned
into a verdict, and the device owner's turn (an untimed job, a timing block, or none for host work) each
command runs under."""

from __future__ import annotations

import contextlib
import threading
import time

from gpu_worker import protocol as msg
from gpu_worker.phases import Heartbeat
from gpu_worker.phases import add_phase as _add_phase
from gpu_worker.phases import phase as _phase
from gpu_worker.sandbox import Rejection, Sandbox, SandboxFailure


class ReferenceOutOfMemory(RuntimeError):
    """The trusted reference child ran out of device memory beside the candidates' children: not the
    candidate's fault, and the child serves on. The stage is run again alone (Evaluator._retried_alone);
    raised again there, it is the harness's error, which the activity's retry meets."""


class EvaluatorChildren:
    """The Evaluator's access to its children, each command under its device turn."""

    def _ref(self, problem, shape, hb) -> tuple[Sandbox, threading.Lock, dict]:
        key = (problem.name, shape.name)
        with self._refs_lock:
            entry = self._refs.get(key)
            if entry and not entry[0].alive():
                entry = None
            if entry is None:
                sb = self.sched.spawn("reference", self.interpreter, self.settings)
                entry = (sb, threading.Lock(), {})
                self._refs[key] = entry
        sb, lock, info = entry
        if not info:
            try:
                # a new child's CUDA context is an untimed device job; Triton's keys and the problem's setup
                # (imports, the baseline's construction) are host work, outside any turn
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

    def _ref_call(self, problem, shape, hb, request: msg.Request, timeout, timing: bool = False) -> msg.Result:
        """One call to the reference child with its lock and a device turn: a timing block's with `timing`,
        else an untimed job's (see _with_ref)."""
        sb, lock, _ = self._ref(problem, shape, hb)
        with self._with_ref(lock, timing):
            return self._ref_do(sb, hb, request, timeout)

    @staticmethod
    def _ref_do(sb: Sandbox, hb, request: msg.Request, timeout) -> msg.Result:
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

    def reference(self, problem, shape, cases, hb, timing: bool = False,
                  baseline: bool = True) -> list[msg.ReferenceCase]:
        """Per case: the inputs' fingerprint and the baseline's own error (NaN without `baseline`), the oracle
        left on the reference child's device for the comparisons; each case computed once. `timing`: in a
        timing block's turn (the warm-up's, with nothing else on the device), else an untimed job's."""
        def key(c):
            return (problem.name, shape.name, c[0], c[1])

        def absent(cs):
            with self._ref_meta_lock:
                return [c for c in cs if key(c) not in self._ref_meta]

        missing = absent(cases)
        if missing:
            sb, lock, _ = self._ref(problem, shape, hb)
            with lock:  # the cases' inputs generated (and banked) or read: host work, before the device turn
                if absent(missing):
                    self._ref_do(sb, hb, msg.Stage(cases=absent(missing)), self.timeouts["reference"])
            with self._with_ref(lock, timing):
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

    def _stage_turn(self):
        """A candidate's stage, counted by the device owner (a stage retried alone runs with no other
        stage; see DeviceOwner.stage). No device turn: on the CPU, nothing."""
        return self.owner.stage() if self.cuda else contextlib.nullcontext()

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

    def _device_job(self):
        """An untimed device job's turn (see DeviceOwner.job); nothing to take on the CPU."""
        return self.owner.job() if self.cuda else contextlib.nullcontext()

    def _timing_block(self):
        """A timing block's turn, nothing else of ours on the device (see DeviceOwner.timing); nothing to
        take on the CPU."""
        return self.owner.timing() if self.cuda else contextlib.nullcontext()

    @contextlib.contextmanager
    def _with_ref(self, lock: threading.Lock, timing: bool = False):
        """A reference child's lock together with a device turn. An untimed job's: DeviceOwner.job(also=),
        which never holds one while waiting for the other. A timing block's (`timing`): the turn first,
        then the lock, which is then held at most by host work or by a job giving it back."""
        if not self.cuda:
            with lock:
                yield
        elif timing:
            with self._timing_block():
                t = time.monotonic()
                with lock:
                    _add_phase("ref-wait", time.monotonic() - t)
                    yield
        else:
            with self.owner.job(also=lock):
                yield

    def _write_exports(self, sb: Sandbox, stage: str, hb) -> list[str]:
        """The late-write check of the outputs a child downloaded (in its `Verify`, or its `HostLatencyRequest`
        with `export`) and their files: host work, no turn.
        Returns the outputs that changed after their call returned."""
        with _phase("export-write"):
            return self._ask(sb, msg.WriteExports(), self.timeouts["verify"], stage, hb).changed

    def _cuda_init(self, sb: Sandbox, hb: Heartbeat = None) -> None:
        """A candidate child's CUDA context, made in an untimed device job (once per child); then Triton's
        per-process keys, host work, outside any turn."""
        with self._device_job():
            self._ask(sb, msg.CudaInit(), self.timeouts["load"], "sandbox", hb)
        self._ask(sb, msg.WarmTriton(), self.timeouts["load"], "sandbox", hb)

    def _load(self, sb: Sandbox, source: str, problem, shape, hb) -> msg.Loaded:
        from gpu_worker.caches import triton_cache_dir

        if self.cuda:
            self._cuda_init(sb, hb)  # a spare has both already: then these are two round trips
        # every load is followed by a compile (_compile_in), whose case is staged with the load: host work
        return self._ask(sb, msg.Load(source=source, problem=problem.name, shape=shape.name, write_roots=[],
                                      trusted_roots=[str(triton_cache_dir(self.settings, self.cuda))],
                                      stage=[(problem.distributions[0], 0)]),
                         self.timeouts["load"], "compile", hb)

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
        """The cases' inputs into the child's host memory (bank reads, or generation): host work, no turn."""
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
