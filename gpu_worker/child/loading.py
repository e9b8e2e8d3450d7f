"""A candidate child's loading and compilation: the candidate's module executed behind the guard and the
OS wall, its Triton kernels found, compiled by Triton's warmup path (nothing launched) and described from
the compiler's output; every call of the candidate goes through `_call`."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

from gpu_worker import protocol
from gpu_worker.child.core import Refused
from gpu_worker.child.interpreter_globals import keep_kernel_globals_private
from gpu_worker.child.launch_options import refuse_compile_options

if TYPE_CHECKING:
    from gpu_worker.child.core import ChildCore
    from gpu_worker.child.inputs import ChildInputs


def ready_triton(cuda: bool) -> None:
    """What a process that runs a candidate sets on Triton before the candidate loads (a sandbox child, the
    profile's process under ncu): launches refuse Triton's compile options, and under the interpreter its
    own names stay out of the candidate's kernels."""
    if not cuda:
        keep_kernel_globals_private()
    refuse_compile_options()


def forget_autotuning(objects) -> None:
    """Empty the choices of the autotuners among `objects` (through the wrappers around them): made while
    every launch was Triton's warmup path, which runs nothing, they were taken on timings of nothing. The
    next real call tunes again, with its launches run."""
    for obj in objects:
        f, depth = obj, 0
        while f is not None and depth < 4:
            if type(f).__name__ == "Autotuner" and isinstance(getattr(f, "cache", None), dict):
                f.cache.clear()
            f, depth = getattr(f, "fn", None), depth + 1


class ChildLoading:
    """A candidate child's load and compile commands, and its guarded call. Built with the child's core
    (which holds the loaded module, the guard's seal and the wall) and its inputs (the compile's case)."""

    PINNED = ("core", "inputs")  # by identity (ChildCore.pin_trusted)

    def __init__(self, core: ChildCore, inputs: ChildInputs):
        self.core, self.inputs = core, inputs
        self.kernels: dict = {}  # name -> the candidate's Triton kernel (_kernel_objects)
        self.before_modules: set = set()  # the modules loaded before the candidate (guard.audit_modules)

    def cmd_load(self, source: str, problem: str, shape: str | None, write_roots: list, trusted_roots: list,
                 stage: list = ()):
        import importlib.util

        from gpu_worker import guard

        core = self.core
        assert core.role == "candidate"
        core._setup_problem(problem, shape)
        # hide the project's modules: a run-time import of them must go through the (refused) import system
        for name in [m for m in sys.modules if m.split(".")[0] in ("baselines", "activities", "workflows")]:
            del sys.modules[name]
        path = os.path.join(core.tmp, "candidate.py")
        with open(path, "w") as f:
            f.write(source)
        before = set(sys.modules)
        if core.cuda:  # Triton's per-process subprocesses (ldconfig, its driver module's build) run before the wall
            core.cmd_cuda_init()
            core.cmd_warm_triton()
            if os.environ.get("TRITON_CACHE_DIR"):  # the refill's kernels, compiled by a trusted child
                from gpu_worker.caches import seed_harness_kernels

                for root in trusted_roots:
                    seed_harness_kernels(os.environ["TRITON_CACHE_DIR"], root)
        ready_triton(core.cuda)
        from gpu_worker import wall

        core.seal, core.wall = wall.enclose(core.tmp, list(write_roots), list(trusted_roots), core.cuda, core.guard_fd,
                                            core.settings.wall, unix_sockets=core.unix_sockets)  # ncu proof only
        core.pins.repin()  # the guard's own wrappers of torch's entries (guard_torch.seal_dispatch_entries)
        spec = importlib.util.spec_from_file_location("candidate", path)
        mod = importlib.util.module_from_spec(spec)
        threads = core.candidate_threads()
        try:
            spec.loader.exec_module(mod)
        except OSError as e:
            self._refused_by_wall(e)
            raise
        core.after_candidate(threads)
        guard.audit_modules(before)
        self.before_modules = before
        if not callable(getattr(mod, "run", None)):
            raise Refused("contract", "candidate defines no callable run(inputs, out)")
        core.module = mod
        self.kernels = self._kernel_objects()
        if stage:  # the compile's case, staged in the same host work (harness/compile.py: compile_in)
            self.inputs.cmd_stage(list(stage))
        return protocol.Loaded(kernels=sorted(self.kernels), wall=core.wall)

    def _kernel_objects(self) -> dict:
        """name -> JITFunction-like object for every Triton kernel the module defines."""
        found = {}
        for name, obj in vars(self.core.module).items():
            f, depth = obj, 0
            while hasattr(f, "fn") and depth < 4 and not hasattr(f, "device_caches"):
                f, depth = f.fn, depth + 1
            if hasattr(f, "device_caches") or type(obj).__name__ in ("InterpretedFunction", "Autotuner", "Heuristics", "JITFunction"):
                found[getattr(getattr(f, "fn", f), "__name__", name)] = f
        return found

    def _call(self, inputs, outs, guarded: bool):
        from gpu_worker import guard

        threads = self.core.candidate_threads()
        try:
            if guarded:
                with guard.dispatch_guard(outputs=outs):
                    self.core.module.run(inputs, outs)
            else:
                self.core.module.run(inputs, outs)
        except OSError as e:
            self._refused_by_wall(e)
            raise
        self.core._sync()
        self.core.after_candidate(threads)
        guard.audit_modules(self.before_modules)
        for rule, detail in self.core.seal.broken():  # a mode left on torch's stacks, a rewritten guard
            raise guard.GuardViolation(rule, detail)

    def _refused_by_wall(self, e: OSError) -> None:
        """An act the OS wall refused (one the guard did not see first) becomes a violation of its family."""
        from gpu_worker import guard, wall

        family = wall.family_of(e, [self.core.tmp]) if self.core.wall.get("os") == "on" else None
        if family:
            self.core.seal.report(family, f"refused by the OS wall: {type(e).__name__}: {e}")
            raise guard.GuardViolation(family, f"refused by the OS wall: {e}") from e

    def cmd_compile(self, dist: str):
        """CUDA: compile every kernel the candidate launches without running it (Triton's warmup path,
        so compilation uses CPU cores, not the GPU), then report the compiler's view of each kernel.
        Interpreter: run once, which is where an interpreted kernel's errors surface."""
        self.inputs.prep_timing = {}
        # the worker uploaded this case beforehand (prepare, in a device job); on CUDA nothing below
        # touches the device but the candidate's own host-side torch calls: Triton's warmup path compiles
        # without launching, and the outputs are not poisoned (their contents are never read here)
        pre = self.inputs.prefetched.get((dist, 0))
        inputs = self.inputs._inputs(dist, 0) if pre is None else self.inputs._to_device(pre)  # no copy if there
        outs = self.core._outputs(poison=not self.core.cuda)
        t0 = time.perf_counter()
        if self.core.cuda:
            self._warmup_call(inputs, outs)
        else:
            self._call(inputs, outs, guarded=True)
        secs = time.perf_counter() - t0
        timing = {k: round(v, 4) for k, v in self.inputs.prep_timing.items()}
        timing["triton"] = round(secs, 4)
        del inputs, outs
        self.inputs.prefetched = {}
        self.core._release()  # this child may wait, kernels loaded, for the candidate's verification
        return protocol.Compiled(seconds=secs, kernels=self._compiled_info(), max_shared=self._max_shared(),
                                 timing=timing)

    def _max_shared(self) -> int | None:
        """The device's shared-memory limit per block (opt-in), as Triton sees it; None without CUDA.
        Triton's warmup path compiles kernels that need more without complaint (they fail at launch), so
        the harness compares each kernel's need with this at compile time."""
        if not self.core.cuda:
            return None
        try:
            import torch
            import triton

            props = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())
            return int(props["max_shared_mem"])
        except Exception:  # noqa: BLE001
            return None

    def _warmup_call(self, inputs, outs):
        """Call the candidate with every Triton launch replaced by Triton's warmup path: kernels are
        compiled (or found in the cache) and nothing runs on the GPU."""
        from triton.runtime.jit import JITFunction

        orig = JITFunction.run

        def warm_run(self_, *args, **kwargs):
            kwargs["warmup"] = True
            return orig(self_, *args, **kwargs)

        JITFunction.run = warm_run
        try:
            self._call(inputs, outs, guarded=True)
        finally:
            JITFunction.run = orig
            forget_autotuning(vars(self.core.module).values())

    def _load_kernels(self, inputs: dict, outs: dict) -> None:
        """Before the worker's timing block: find the candidate's kernels in Triton's cache and load them
        onto the device, so that the first timed or verified call does not pay for it inside the block.
        Best effort: a failure here surfaces again, properly reported, in the real call. CUDA only."""
        try:
            self._warmup_call(inputs, outs)
            for f in self.kernels.values():
                for dev_entry in (getattr(f, "device_caches", None) or {}).values():
                    cache = dev_entry[0] if isinstance(dev_entry, tuple) else dev_entry
                    for k in list(cache.values()):
                        k._init_handles()
        except Exception as e:  # noqa: BLE001
            print(f"kernel pre-load skipped: {type(e).__name__}: {e}", flush=True)

    def _compiled_info(self) -> list[dict]:
        info = []
        for name, f in self.kernels.items():
            caches = getattr(f, "device_caches", None)
            if not caches:
                info.append({"name": name})
                continue
            for dev_entry in caches.values():
                kernel_cache = dev_entry[0] if isinstance(dev_entry, tuple) else dev_entry
                for k in list(kernel_cache.values()):
                    md = k.metadata
                    d = {"name": getattr(md, "name", name), "num_warps": getattr(md, "num_warps", None),
                         "num_stages": getattr(md, "num_stages", None), "shared": getattr(md, "shared", None)}
                    try:
                        k._init_handles()
                        d["registers"] = int(k.n_regs)
                        d["spills"] = int(k.n_spills)
                    except Exception as e:  # noqa: BLE001
                        d["handles_error"] = str(e)[:200]
                    asm = getattr(k, "asm", {}) or {}
                    ptx = asm.get("ptx") or ""
                    d["ptx_wgmma"] = "wgmma" in ptx
                    d["ptx_mma"] = "mma.sync" in ptx or "wgmma" in ptx or "tcgen05.mma" in ptx
                    d["ptx_tma"] = "cp.async.bulk.tensor" in ptx
                    cubin = asm.get("cubin")
                    if isinstance(cubin, (bytes, bytearray)):
                        p = os.path.join(self.core.tmp, f"{d['name']}-{len(info)}.cubin")
                        with open(p, "wb") as fh:
                            fh.write(cubin)
                        d["cubin_path"] = p
                    info.append(d)
        return info
