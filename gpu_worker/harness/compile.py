"""The compile stage: static rules, the candidate loaded in a sandbox child and compiled by Triton's warmup
path (nothing launched), then the compiler's report (registers, spills, shared memory, tensor cores, TMA)."""

from __future__ import annotations

import contextlib
import time

from gpu_worker import protocol as msg
from gpu_worker.harness.children import CandidateChildren, DeviceTurns
from gpu_worker.harness.context import StageContext
from gpu_worker.phases import Heartbeat
from gpu_worker.phases import add_phase as _add_phase
from gpu_worker.phases import phase as _phase
from gpu_worker.phases import waiting_heartbeat as _waiting_heartbeat
from gpu_worker.sandbox import Rejection, Sandbox, SandboxFailure
from gpu_worker.sass import scan_sass
from workflows.contracts import CompileReport, EvalRequest


def shared_over_limit(kernels: list[msg.CompiledKernel], limit: int | None) -> str | None:
    """The compile rejection for kernels that need more shared memory than the device gives a block
    (they compile, then fail at their first launch, which would be in a device turn), else None."""
    if not limit:
        return None
    over = [k for k in kernels if (k.shared or 0) > limit]
    if not over:
        return None
    k = max(over, key=lambda k: k.shared)
    return (f"compile-error: OutOfResources: {k.name} needs {k.shared} bytes of shared memory, the "
            f"device allows {limit} per block (lower BLOCK sizes or num_stages)")


class CompileStage:
    """The Evaluator's compile stage; `compile_in` also compiles a child loaded afresh for a later stage."""

    def __init__(self, ctx: StageContext, turns: DeviceTurns, children: CandidateChildren):
        self.ctx, self.turns, self.children = ctx, turns, children

    def compile(self, req: EvalRequest, hb: Heartbeat = None) -> CompileReport:
        return self.children.retried_alone(lambda: self._compile_once(req, hb))

    def _compile_once(self, req: EvalRequest, hb: Heartbeat = None) -> CompileReport:
        _waiting_heartbeat(hb)
        ctx = self.ctx
        t0 = time.monotonic()
        source = ctx.source(req.source_key)
        try:
            problem, shape = ctx.checked(req, source)
            # room kept for a child its verification will take here (LoadedChildren.admission)
            with ctx.loaded.admission(hb) if req.next_stage else contextlib.nullcontext(0.0) as waited:
                _add_phase("admit-wait", waited)
                kernels, sass, log = self._compiled_kept(req, source, problem, shape, hb)
        except Rejection as rej:
            return CompileReport(ok=False, error=rej.reason[:4000], interpreter=ctx.interpreter,
                                 log_key=ctx.log(rej.reason + "\n" + rej.log), seconds=time.monotonic() - t0)
        except SandboxFailure as f:
            return CompileReport(ok=False, error=f"{f.kind}: {f.reason}", interpreter=ctx.interpreter,
                                 log_key=ctx.log(f.log), seconds=time.monotonic() - t0)

        def mx(key):
            vals = [getattr(k, key) for k in kernels if getattr(k, key) is not None]
            return max(vals) if vals else None

        tc = tma = None
        if ctx.cuda and kernels:
            tc = any(k.ptx_mma for k in kernels) or sass.get("hgmma", False)
            tma = any(k.ptx_tma for k in kernels) or sass.get("tma", False)
        lines = [f"{k.name}: regs={k.registers} spills={k.spills} shared={k.shared} "
                 f"warps={k.num_warps} stages={k.num_stages} wgmma={k.ptx_wgmma} "
                 f"tma={k.ptx_tma}" for k in kernels]
        if sass.get("text"):
            lines.append(sass["text"])
        return CompileReport(
            ok=True, registers=mx("registers"), spills=mx("spills"), shared_bytes=mx("shared"),
            num_warps=mx("num_warps"), num_stages=mx("num_stages"), tensor_cores=tc, tma=tma,
            kernels=sorted({k.name for k in kernels if k.name}), interpreter=ctx.interpreter,
            log_key=ctx.log("\n".join(lines) + "\n" + log), seconds=time.monotonic() - t0)

    def _compiled_kept(self, req: EvalRequest, source: str, problem, shape, hb):
        """The candidate compiled in a child kept for its verification (LoadedChildren); returns its kernels,
        the SASS scan and the child's log. A rejection closes the child."""
        ctx = self.ctx
        sb = self.children.pool.acquire()
        kept = False
        try:
            with _phase("load"):
                self.children.load(sb, source, problem, shape, hb)
            with self.turns.stage():
                r = self.compile_in(sb, problem, hb, "compile")
            for k, v in r.timing.items():
                _add_phase(f"compile.{k}", v)
            over = shared_over_limit(r.kernels, r.max_shared)
            if over:
                raise Rejection("compile", over, sb.log_tail())
            with _phase("sass"):
                sass = scan_sass([k.model_dump() for k in r.kernels])
            log = sb.log_tail()
            ctx.loaded.put(ctx.child_key(req.problem, shape, req.source_key), sb, parked=not req.next_stage)
            kept = True
            return r.kernels, sass, log
        finally:
            if not kept:
                sb.close()

    def compile_in(self, sb: Sandbox, problem, hb, stage: str) -> msg.Compiled:
        """Compile the loaded candidate at the child's shape: one case (staged by its load) uploaded in an
        untimed device job (the one device step of compiling), Triton's warmup path outside any turn, so
        that a timing block never waits for a compiler (under the interpreter: one run). Returns the compile
        reply."""
        dist = problem.distributions[0]
        with _phase("prepare"), self.turns.job():
            pre = self.children.ask(sb, msg.Prepare(cases=[(dist, 0)], kernels=False), self.ctx.timeouts["load"],
                                    stage, hb)
        for k, v in pre.timing.items():
            _add_phase(f"prepare.{k}", v)
        with _phase("compile"):
            r = self.children.ask(sb, msg.Compile(dist=dist), self.ctx.timeouts["compile"], stage, hb)
        self.children.harvest_render(sb)
        return r
