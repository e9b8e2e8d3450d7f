"""The device turns every command runs under (`DeviceTurns`: an untimed job, a timing block, or none for
host work) and the candidates' children (`CandidateChildren`): loaded, handed on and parked, each
command's reply turned into a verdict, and a stage retried with the device to itself."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Callable

from gpu_worker import protocol as msg, wire
from gpu_worker.harness.context import StageContext
from gpu_worker.phases import Heartbeat
from gpu_worker.phases import add_phase as _add_phase
from gpu_worker.phases import phase as _phase
from gpu_worker.render_kernels import RenderKernels
from gpu_worker.sandbox import Rejection, Sandbox, SandboxFailure, candidate_triton_cache


#: a stage's refusal where the host may be at fault (harness.ncu_proof: ProofResult.host_suspected): retried
#: with the device to itself, as an out-of-memory is, and what is refused there stands
HOST_SUSPECTED = "host-suspected: "


class ReferenceOutOfMemory(RuntimeError):
    """The trusted reference child ran out of device memory beside the candidates' children: not the
    candidate's fault, and the child serves on. The stage is run again alone (CandidateChildren.retried_alone);
    raised again there, it is the harness's error, which the activity's retry meets."""


class DeviceTurns:
    """The device owner's turns as the stages take them; on the CPU (no device) none is taken."""

    def __init__(self, ctx: StageContext):
        self.ctx = ctx

    def stage(self):
        """A candidate's stage, counted by the device owner (a stage retried alone runs with no other
        stage; see DeviceOwner.stage). No device turn: on the CPU, nothing."""
        return self.ctx.owner.stage() if self.ctx.cuda else contextlib.nullcontext()

    def job(self):
        """An untimed device job's turn (see DeviceOwner.job); nothing to take on the CPU."""
        return self.ctx.owner.job() if self.ctx.cuda else contextlib.nullcontext()

    def timing(self):
        """A timing block's turn, nothing else of ours on the device (see DeviceOwner.timing); nothing to
        take on the CPU."""
        return self.ctx.owner.timing() if self.ctx.cuda else contextlib.nullcontext()

    @contextlib.contextmanager
    def with_ref(self, lock: threading.Lock, timing: bool = False):
        """A reference child's lock together with a device turn. An untimed job's: DeviceOwner.job(also=),
        which never holds one while waiting for the other. A timing block's (`timing`): the turn first,
        then the lock, which is then held at most by host work or by a job giving it back."""
        if not self.ctx.cuda:
            with lock:
                yield
        elif timing:
            with self.timing():
                t = time.monotonic()
                with lock:
                    _add_phase("ref-wait", time.monotonic() - t)
                    yield
        else:
            with self.ctx.owner.job(also=lock):
                yield


class CandidateChildren:
    """The candidates' children: warm spares (`pool`), the loaded ones kept between stages (ctx.loaded),
    and every command to them with its verdict."""

    def __init__(self, ctx: StageContext, turns: DeviceTurns):
        self.ctx, self.turns = ctx, turns
        self.cuda_ready: weakref.WeakSet = weakref.WeakSet()  # children whose CUDA context and Triton keys are made
        # last: a CUDA pool's background thread readies spares through cuda_init, which needs the above
        self.pool = ctx.sched.pool(ctx.interpreter, ready=self.cuda_init if ctx.cuda else None,
                                   settings=ctx.settings)
        self.renders = RenderKernels(ctx.settings, ctx.cuda) if ctx.cuda else None

    def close(self) -> None:
        self.pool.close()
        self.ctx.loaded.close()

    def ask(self, sb: Sandbox, request: msg.Request, timeout: float, stage: str, hb) -> msg.Result:
        """One command of a candidate child; its result, or the Rejection its failure is (check_reply)."""
        r = sb.call(request, timeout, hb)
        self.check_reply(r, stage, sb)
        return r.result

    @staticmethod
    def check_reply(r: wire.Reply, stage: str, sb: Sandbox):
        """A candidate child's reply as a verdict: a guard's violation, then a failed command, is a Rejection."""
        if r.violations:
            rule, detail = r.violations[0]
            raise Rejection("rules", f"{rule}: {detail} (run-time guard)", sb.log_tail())
        if not r.ok:
            kind = r.failure.kind
            st = {"cuda-error": "sandbox", "oom": "sandbox", "contract": "rules"}.get(kind, stage)
            raise Rejection(st, f"{kind}: {r.failure.error}", r.failure.traceback + "\n" + sb.log_tail())

    def write_exports(self, sb: Sandbox, stage: str, hb) -> list[str]:
        """The late-write check of the outputs a child downloaded (in its `Verify`, or its `HostLatencyRequest`
        with `export`) and their files: host work, no turn.
        Returns the outputs that changed after their call returned."""
        with _phase("export-write"):
            return self.ask(sb, msg.WriteExports(), self.ctx.timeouts["verify"], stage, hb).changed

    def cuda_init(self, sb: Sandbox, hb: Heartbeat = None) -> None:
        """A candidate child's CUDA context, made in an untimed device job (once per child); then Triton's
        per-process keys, host work, outside any turn."""
        if sb in self.cuda_ready:
            return
        with self.turns.job():
            self.ask(sb, msg.CudaInit(), self.ctx.timeouts["load"], "sandbox", hb)
        self.ask(sb, msg.WarmTriton(), self.ctx.timeouts["load"], "sandbox", hb)
        self.cuda_ready.add(sb)

    def load(self, sb: Sandbox, source: str, problem, shape, hb) -> msg.Loaded:
        from gpu_worker.caches import triton_cache_dir

        if self.ctx.cuda:
            self.cuda_init(sb, hb)  # a spare readied by the pool has both already: then nothing to do
        self.seed_render(sb, problem, source)
        # every load is followed by a compile (CompileStage.compile_in), whose case is staged with the
        # load: host work
        return self.ask(sb, msg.Load(source=source, problem=problem.name, shape=shape.name, write_roots=[],
                                     trusted_roots=[str(triton_cache_dir(self.ctx.settings, self.ctx.cuda))],
                                     stage=[(problem.distributions[0], 0)]),
                        self.ctx.timeouts["load"], "compile", hb)

    def seed_render(self, sb: Sandbox, problem, source: str) -> None:
        """A child about to load a render of the problem's template gets the entries its earlier children
        compiled (render_kernels); `sb.render_digest` marks it for the harvest after its compile."""
        sb.render_digest, copied = (self.renders.seed_source(problem, source, candidate_triton_cache(sb.tmp))
                                    if self.renders is not None else (None, 0))
        if sb.render_digest:
            _add_phase("render-seed-n", copied)

    def harvest_render(self, sb: Sandbox) -> None:
        """What a render's child compiled, kept for the source's later children (host work, after its compile)."""
        if getattr(sb, "render_digest", None):
            with _phase("render-harvest"):
                try:
                    kept = self.renders.harvest(sb.render_digest, candidate_triton_cache(sb.tmp))
                    _add_phase("render-harvest-n", kept)
                except OSError as e:  # a store that cannot be written costs compiles, never a verdict
                    print(f"render kernels not kept: {e}", flush=True)

    def loaded_child(self, key, source: str, problem, shape, hb) -> tuple[Sandbox, msg.Loaded | None]:
        """The child the previous stage left with this candidate loaded, else a fresh one loaded now.
        Returns it with the load's result (None when handed on: loading happened in the earlier stage)."""
        sb = self.ctx.loaded.take(key)
        if sb is not None:
            _add_phase("handed-on", 1)
            return sb, None
        sb = self.pool.acquire()
        try:
            with _phase("load"):
                return sb, self.load(sb, source, problem, shape, hb)
        except BaseException:
            sb.close()
            raise

    def stage_cases(self, sb: Sandbox, cases: list, stage: str, hb, pool_cases: list = ()) -> None:
        """The cases' inputs into the child's host memory (bank reads, or generation): host work, no turn;
        `pool_cases`: its benchmark's timing pools as well, where the bank holds them."""
        with _phase("stage"):
            self.ask(sb, msg.Stage(cases=cases, pool_cases=list(pool_cases)), self.ctx.timeouts["load"], stage, hb)

    @staticmethod
    def park(sb: Sandbox, pool_cases: list = ()) -> bool:
        """A child about to wait for a later benchmark drops its timing sets (child/timing.py: park) and maps in
        the banked `pool_cases` for it; False if it cannot (then it is closed, not kept)."""
        try:
            return sb.alive() and sb.call(msg.Park(pool_cases=list(pool_cases)), 60).ok
        except SandboxFailure:
            return False

    def retried_alone(self, attempt: Callable):
        """A stage that ran out of device memory, whose child was killed by a SIGKILL the harness did not
        send (most likely the host's OOM killer), or refused for a reason the host may have caused
        (HOST_SUSPECTED), is run once more with the device to itself
        (DeviceOwner.alone: no other stage of ours runs meanwhile): beside up to 24 other candidates the memory may have been taken by the
        neighbours, and an innocent candidate must not be scored for it (on the H200 that was 9 of 49 prefill
        evaluations in one run). What fails alone is the candidate's.
        The report says both: the retry's log starts with the first attempt's reason. The trusted reference
        child running out of memory during the stage (ReferenceOutOfMemory) is retried alone the same way."""
        retries = self.ctx.cuda and self.ctx.owner.retries_alone
        try:
            first = attempt()
        except ReferenceOutOfMemory as e:
            if not retries:
                raise
            first, why = None, str(e)
        else:
            why = (getattr(first, "reason", "") or getattr(first, "error", "") or "") if not first.ok else ""
            if not (retries and (why.startswith(("oom:", HOST_SUSPECTED))
                                 or (why.startswith("crash:") and "SIGKILL" in why))):
                return first
        _add_phase("retried-alone", 1)
        # the whole attempt is one stage alone, its child's loading included: a fresh child's CUDA context
        # and load, which come before the stage's own gate, take device memory too (a stage inside it is
        # part of it)
        with self.ctx.owner.alone(on_start=self.shed_idle), self.ctx.owner.stage():
            rep = attempt()
        extra = {"seconds": (getattr(first, "seconds", 0) or 0) + (rep.seconds or 0)} if hasattr(rep, "seconds") else {}
        if hasattr(rep, "gpu_seconds"):
            extra["gpu_seconds"] = (getattr(first, "gpu_seconds", 0) or 0) + (rep.gpu_seconds or 0)
        note = f"first attempt beside other candidates: {why[:300]}; retried with the device to itself\n"
        extra["log_key"] = self.ctx.log(note + (self.ctx.store.get_text(rep.log_key) if rep.log_key else ""))
        return rep.model_copy(update=extra)

    def shed_idle(self) -> None:
        """Before a stage retried alone: the warm spares and the children kept between stages closed, so
        that the memory they hold (on the H200, 84 processes once held all 140 GiB) is the stage's; they
        are made again as needed."""
        try:
            _add_phase("shed-children", self.pool.shed() + self.ctx.loaded.shed())
        except Exception as e:  # noqa: BLE001 - the retry runs anyway, beside what could not be closed
            print(f"shedding idle children failed: {type(e).__name__}: {e}", flush=True)
