"""A sandbox child's core, which every part of gpu_worker.child.Server is built with: the trusted references
it captures before any candidate code exists in its process (and the pins over them), its CUDA context and
device memory, the problem and shape it serves, the loaded candidate, the violations it reports with every
reply and how a failure is described."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from gpu_worker import protocol, wire
from gpu_worker.child.transfers import PinnedStaging, madvise_ref
from gpu_worker.guard_torch import mode_stacks
from gpu_worker.pins import Pins


class Refused(Exception):
    """A command the child will not carry out as asked (a contract the candidate breaks, a step out of
    order): its failure reply says `kind` and `error`, and the child goes on serving."""

    def __init__(self, kind: str, error: str):
        super().__init__(error)
        self.kind, self.error = kind, error


def _warm_triton() -> None:
    """What Triton computes once per process before its first kernel lookup (the driver and its
    utilities, the backend's hash with ptxas's version, the hash of Triton's own files), done while this
    child waits as a spare. Best effort: the names moved between Triton versions."""
    try:
        from triton.compiler.compiler import make_backend
        from triton.runtime import driver

        make_backend(driver.active.get_current_target()).hash()
        try:
            from triton.runtime.cache import triton_key
        except ImportError:
            from triton.compiler.compiler import triton_key
        triton_key()
    except Exception as e:  # noqa: BLE001
        print(f"triton warm-up skipped: {type(e).__name__}: {e}", flush=True)


def compared_outputs(problem, shape, cpu: bool) -> tuple:
    """The outputs compared with the oracle for this shape (a problem may drop some per shape)."""
    if hasattr(problem, "compared_outputs"):
        return tuple(problem.compared_outputs(shape))
    specs = problem.output_specs(shape, cpu=cpu)
    return tuple(n for n in problem.outputs if n in specs)


def generator_tag(problem) -> str | None:
    """Names the input generator's version: its source files and torch's version (torch's RNG
    streams may change between versions), so that a bank file is never read by other code."""
    import hashlib

    import torch

    import baselines.perturb  # noqa: F401 - a file's parameters are drawn through it

    h = hashlib.sha256(torch.__version__.encode())
    try:
        for mod in (getattr(problem.make_inputs, "__module__", None), "baselines.problem", "baselines.perturb"):
            f = getattr(sys.modules.get(mod), "__file__", None)
            if not f:
                return None
            with open(f, "rb") as fh:
                h.update(fh.read())
    except OSError:
        return None
    return h.hexdigest()[:16]


def _unreaped_child() -> str | None:
    """A child process of this one that nobody waited for: the compiler programs the guard admits are run
    and waited for within one command, so any other was started by the candidate, even one whose program
    the OS wall then refused to execute (its exec fails in the child, which exits unseen). Reaped here."""
    import os

    try:
        pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return None
    if pid == 0:
        return "still running"
    return f"pid {pid}, exit status {os.waitstatus_to_exitcode(status)}"


def _torch_rewrap(torch):
    """Whether a rebound slot holds its pinned function under torch's own lazy wrapper (torch._dynamo, first
    imported by the interpreter during a call, wraps torch.manual_seed with torch._disable_dynamo)."""
    wrapper = torch._disable_dynamo(_torch_rewrap) if hasattr(torch, "_disable_dynamo") else None
    code = getattr(wrapper, "__code__", None)

    def same(old, new) -> bool:
        return code is not None and getattr(new, "__code__", None) is code and getattr(new, "__wrapped__", None) is old

    return same


class ChildCore:
    """The state every part of a child shares, and the commands that make its context."""

    PINNED = ("T", "pins", "watch", "saved", "staging")  # by identity, in a candidate's child (pin_trusted)

    def __init__(self, tmp: str, role: str, settings=None):
        """`settings`: the worker's GpuWorkerSettings, as the child's channel carried them (child.main)."""
        import hashlib

        import numpy
        import torch

        from gpu_worker.settings import GpuWorkerSettings

        self.tmp, self.role = tmp, role
        self.cuda = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
        self.settings = (settings or GpuWorkerSettings()).for_device(self.cuda)
        self.device = "cuda" if self.cuda else "cpu"
        self.cuda_ready = False
        self.triton_warm = False  # Triton's per-process keys computed (cmd_warm_triton)
        self.guard_fd: int | None = None  # the guard's channel to the worker (child.main)
        self.unix_sockets = False  # the OS wall lets the ncu proof's channel through (ncu_proof_child)
        self.seal = self.wall = None  # the guard and the OS wall, once a candidate loads (ChildLoading.cmd_load)
        self.module = None
        self.ran = False  # the candidate has run for real here: its kernels are loaded (see ChildTiming.cmd_prepare)
        self.problem = None
        self.shape = None
        self.cpu_mode = not self.cuda
        self.bank_tag = None
        self.baseline_name, self.baseline = None, None  # the reference role's (ChildReference.cmd_setup)
        # trusted references, captured before any candidate code exists in this process
        self.T = {
            "perf": time.perf_counter,
            "sha": hashlib.sha256,
            "fill_": torch.Tensor.fill_,
            "copy_": torch.Tensor.copy_,
            "clone": torch.Tensor.clone,
            "to": torch.Tensor.to,
            "zero_": torch.Tensor.zero_,
            "contiguous": torch.Tensor.contiguous,
            "view": torch.Tensor.view,
            "empty": torch.empty,
            "numpy": torch.Tensor.numpy,
            "copyto": numpy.copyto,
            "urandom": os.urandom,
            "sum": torch.sum,
            "dot": torch.dot,
            "randn": torch.randn,
            "Generator": torch.Generator,
            "float32": torch.float32,
            "bfloat16": torch.bfloat16,
            "narrow": torch.Tensor.narrow,
            "add": torch.add,
        }
        self.watch = [(torch.Tensor, n) for n in ("fill_", "copy_", "clone", "to", "zero_", "contiguous", "view",
                                                  "is_floating_point", "numel", "narrow")]
        self.watch += [(torch, "empty"), (time, "perf_counter"), (os, "urandom"), (torch, "sum"), (torch, "dot"),
                       (torch, "randn"), (torch, "Generator"), (torch, "add"), (torch, "roll")]
        if self.cuda:
            self.T.update(sync=torch.cuda.synchronize, Event=torch.cuda.Event, record=torch.cuda.Event.record,
                          elapsed=torch.cuda.Event.elapsed_time, graph=torch.cuda.CUDAGraph, sleep=torch.cuda._sleep,
                          replay=torch.cuda.CUDAGraph.replay)
            self.watch += [(torch.cuda, "synchronize"), (torch.cuda, "Event"), (torch.cuda.Event, "record"),
                           (torch.cuda.Event, "elapsed_time"), (torch.cuda, "CUDAGraph"), (torch.cuda, "_sleep"),
                           (torch.cuda.CUDAGraph, "replay"), (torch.cuda.CUDAGraph, "capture_begin"),
                           (torch.cuda.CUDAGraph, "capture_end"), (torch.cuda, "graph")]
        self.saved = {(id(o), n): getattr(o, n) for o, n in self.watch}
        self.T.update(threads=threading.enumerate, listdir=os.listdir, madvise=madvise_ref())
        self.pins = Pins(same=_torch_rewrap(torch))
        # every large copy between host memory and the device goes through it, where the setting asks
        self.staging = PinnedStaging(self.T, self.cuda and self.settings.pinned_staging,
                                     self.pins if role == "candidate" else None)

    def pin_trusted(self, server, parts: dict, state_classes: tuple) -> None:
        """Before any candidate exists here: what the trusted code calls (gpu_worker.pins), by identity,
        with the composed `server` and its `parts` (name -> part, this core among them): their classes, which
        of the server's attributes holds each part, and in each part what it was built with and holds for
        the trusted code (the part class's PINNED); `state_classes`: those of the state the parts make later
        (the timing set). Candidate role only."""
        import multiprocessing.connection

        import torch

        from gpu_worker import guard, guard_torch, pins, timing_inputs, wall  # noqa: F401 - loaded to be pinned

        for m in pins.trusted_modules():
            self.pins.add_module(m, shadowing=m.__name__.startswith("gpu_worker."))
        for m in (torch, torch.cuda, torch.nn.functional):
            self.pins.add_module(m)
        for c in (type(server), *(type(p) for p in parts.values()), *state_classes, torch.Tensor, torch.Generator,
                  timing_inputs.FreshValues, guard.Seal, multiprocessing.connection.Connection, PinnedStaging):
            self.pins.add_class(c)
        if self.cuda:
            for c in (torch.cuda.Event, torch.cuda.CUDAGraph, torch.cuda.Stream):
                self.pins.add_class(c)
        self.pins.add("T", self.T, list(self.T))
        self.pins.add("server", vars(server), list(parts))
        self.pins.add("staging", vars(self.staging), ["T", "cuda", "pins", "chunk", "buffers", "events"])
        for name, part in parts.items():
            self.pins.add(name, vars(part), list(type(part).PINNED))
        # the modules the trusted code imports later, loaded now: a module planted under one of these names
        # would be what that import returns
        import gpu_worker.devicetime  # noqa: F401
        import gpu_worker.timing  # noqa: F401

        tops = ("gpu_worker", "torch", "triton", "numpy", "time", "os", "threading", "pickle", "math", "hashlib",
                "json", "multiprocessing", "importlib", "gc", "sys", "builtins")
        self.pins.add("sys.modules", sys.modules, [n for n in list(sys.modules) if n.split(".")[0] in tops])
        self.pins.add("sys", vars(sys), ["excepthook", "unraisablehook", "displayhook", "breakpointhook",
                                         "meta_path", "path_hooks", "modules"])
        # torch's intra-op threads start at its first parallel op: here, not inside a call of the
        # candidate, where new threads alive after the call are refused (after_candidate)
        torch.ones(1 << 20).sum()

    def candidate_threads(self) -> tuple:
        """The threads alive now, Python's and the process's tasks: taken before a call of the candidate."""
        return (frozenset(t.ident for t in self.T["threads"]()), frozenset(self.T["listdir"]("/proc/self/task")))

    @staticmethod
    def _unnamed_task(tid: str) -> bool:
        """Whether a task of this process bears the process's own name, as every thread Python starts does
        (the driver's and the libraries' threads name themselves; naming one needs ctypes, refused)."""
        try:
            with open(f"/proc/self/task/{tid}/comm") as f, open("/proc/self/comm") as g:
                return f.read() == g.read()
        except OSError:  # ended meanwhile
            return False

    def after_candidate(self, threads: tuple) -> None:
        """Right after every call of the candidate, before any trusted code runs on: a thread it started that
        is still alive (work finished after the call returned is never timed nor checked), or a slot of the
        trusted code rebound (gpu_worker.pins), is refused at once."""
        seal = self.seal
        if seal is not None and mode_stacks() != seal.modes:  # torch would run its code inside the harness's
            self._refuse("lazy-output", f"torch modes left active by the candidate (function/dispatch stacks "
                         f"{mode_stacks()[:2]} where {seal.modes[:2]} were before it loaded)")
        hooks = self._foreign_hooks()
        if hooks:
            self._refuse("escape", f"the candidate left code of its own for the interpreter to run later: {hooks}")
        now = self.candidate_threads()
        started = (now[0] - threads[0], [t for t in now[1] - threads[1] if self._unnamed_task(t)])
        if started[0] or started[1]:
            self._refuse("lazy-output", f"the candidate left {len(started[0]) or len(started[1])} thread(s) of its "
                         "own running after its call returned: work done after the call is never timed or checked")
        changed = self.pins.changed()
        if changed:
            self._refuse(self._family_of_slots(changed), "rebound by the candidate: " + ", ".join(changed[:6]))

    def _foreign_hooks(self) -> str:
        """Hooks through which the interpreter would run candidate code later, inside the harness's own:
        the garbage collector's callbacks, import finders and path hooks, trace and profile functions
        (threads' included). Empty when every one is the libraries' own."""
        seal = self.seal
        if seal is None:
            return ""
        import gc

        found = [f"{where}: {type(h).__name__}" for where, hooks in (
            ("gc.callbacks", gc.callbacks), ("sys.meta_path", sys.meta_path), ("sys.path_hooks", sys.path_hooks),
            ("trace", [sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile()]))
            for h in hooks if h is not None and not seal.library_object(h)]
        return ", ".join(found[:4])

    @staticmethod
    def _family_of_slots(names: list) -> str:
        timers = ("perf_counter", "synchronize", "Event", "record", "elapsed_time", "CUDAGraph", "_sleep",
                  "replay", "capture_begin", "capture_end", "graph", "perf", "sync", "elapsed", "sleep")
        return "timer" if any(n.rsplit(".", 1)[-1] in timers for n in names) else "escape"

    def _refuse(self, rule: str, detail: str):
        """A violation found by the child's own checks: reported at once on the guard's channel (when the
        candidate is loaded), recorded, and raised."""
        from gpu_worker import guard

        seal = self.seal
        if seal is not None:
            seal.report(rule, detail)
        else:
            guard.VIOLATIONS.append((rule, detail))
        raise guard.GuardViolation(rule, detail)

    def cmd_cuda_init(self):
        """Create this child's CUDA context. The worker asks for it in an untimed device job (a spare does
        it while it waits), so the context is never created while another child is being timed, nor later
        inside a timing block."""
        if self.cuda and not self.cuda_ready:
            import torch

            torch.empty(1, device="cuda")
            self.staging.ready()
            torch.cuda.synchronize()
            self.cuda_ready = True
        return protocol.CudaReady(cuda=self.cuda)

    def cmd_warm_triton(self):
        """Triton's per-process keys, after the context: host work only (file hashes, `ptxas --version`),
        so the worker asks for it outside any device turn: inside a job it would keep a waiting timing
        block waiting for it (~6 s)."""
        if self.cuda and not self.triton_warm:
            _warm_triton()
            self.triton_warm = True
        return protocol.Empty()

    # --- helpers ---------------------------------------------------------------------------------
    def violations(self):
        if self.role != "candidate":
            return []
        from gpu_worker import guard

        out = list(guard.VIOLATIONS)
        seal = self.seal
        if seal is not None:
            out += [v for v in seal.broken() if v not in out]
        out += [(self._family_of_slots([n]), f"{n} was rebound by the candidate") for n in self.pins.changed()
                if (self._family_of_slots([n]), f"{n} was rebound by the candidate") not in out]
        started = _unreaped_child()
        if started:
            out.append(("process", f"the candidate started a process of its own ({started}); only Triton's "
                                   "compiler may, and it waits for its own"))
        timers = ("perf_counter", "synchronize", "Event", "record", "elapsed_time", "CUDAGraph", "_sleep",
                  "replay", "capture_begin", "capture_end", "graph")
        for o, n in self.watch:
            if getattr(o, n) is not self.saved[(id(o), n)]:
                out.append(("timer" if n in timers else "escape",
                            f"{getattr(o, '__name__', o)}.{n} was replaced by the candidate"))
        return out

    def describe_failure(self, e: BaseException) -> wire.Failure:
        from gpu_worker import guard

        tb = traceback.format_exc()
        print(tb, flush=True)
        text = f"{type(e).__name__}: {e}"
        kind, fatal = "exception", False
        low = text.lower()
        if isinstance(e, guard.GuardViolation):
            kind = "violation"
        elif "out of memory" in low or "can't allocate memory" in low or type(e).__name__ == "OutOfMemoryError":
            # a candidate's context is never trusted again; the reference child's allocation failed beside
            # the neighbours' memory, which leaves its context usable: it gives its cached blocks back and
            # serves on (the harness retries the stage alone)
            kind, fatal = "oom", self.role != "reference"
            if not fatal:
                try:
                    self._release()
                except Exception:  # noqa: BLE001 - a context that cannot free its cache is done after all
                    fatal = True
        elif "illegal memory access" in low or "misaligned address" in low or "cuda error" in low \
                or "illegal instruction" in low or "unspecified launch failure" in low:
            kind, fatal = "cuda-error", True
        elif type(e).__name__ in ("CompilationError", "CompileTimeAssertionFailure") or "triton" in type(e).__module__:
            kind = "compile-error"
        return wire.Failure(kind=kind, error=text[-4000:], traceback=tb[-6000:], fatal=fatal)

    def _release(self):
        """Give cached device blocks back while this child waits between stages (see LoadedChildren)."""
        if self.cuda:
            import torch

            torch.cuda.empty_cache()

    def _sync(self):
        if self.cuda:
            self.T["sync"]()

    def _shape(self, problem, shape_name: str | None):
        if shape_name is None:
            return problem.shapes[0] if self.cuda else problem.cpu_shape
        found = problem.shape_named(shape_name)
        if found is not None:
            return found
        raise ValueError(f"problem {problem.name} has no shape {shape_name!r}")

    def _outputs(self, poison: bool = True) -> dict:
        import torch

        outs = {}
        for name, spec in self.output_specs(self.shape, cpu=self.cpu_mode).items():
            t = self.T["empty"](spec.shape, dtype=getattr(torch, spec.dtype), device=self.device)
            if poison:
                self.T["fill_"](t, float("nan") if t.is_floating_point() else -12345)
            outs[name] = t
        return outs

    def _setup_problem(self, problem: str, shape: str | None):
        from baselines.registry import get_problem

        p = get_problem(problem)
        self.problem = p
        self.shape = self._shape(p, shape)
        self.make_inputs = p.make_inputs
        self.output_specs = p.output_specs
        # taken now, before any candidate loads: one that rebinds the problem's methods changes nothing
        self.perturbed = p.perturbed
        self.outputs = compared_outputs(p, self.shape, self.cpu_mode)
        self.bank_tag = generator_tag(p)
        if self.role == "candidate":  # what derives the timed values, before the candidate loads
            import sys

            import baselines.perturb
            import baselines.problem

            for m in {sys.modules[type(p).__module__], baselines.perturb, baselines.problem}:
                self.pins.add_module(m, shadowing=True)
            self.pins.add_class(type(p))
            self.pins.add("core", vars(self), ["problem", "shape", "make_inputs", "output_specs", "perturbed",
                                                 "outputs"])
        return p
