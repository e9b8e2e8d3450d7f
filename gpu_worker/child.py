"""The sandbox child process: `python -m gpu_worker.child FD_IN FD_OUT TMPDIR ROLE`.

ROLE is `candidate` (untrusted code is loaded into it, one candidate per process, then it exits) or
`reference` (trusted: oracle, baseline, ceilings, receipts; never loads candidate code).

The parent talks to the child through two pipes (the typed messages of gpu_worker.protocol, as plain
pickled values); the
child's own stdout/stderr go to TMPDIR/log.txt, so whatever the candidate prints cannot forge a reply.
Everything the harness needs to time or hash (events, synchronize, perf_counter, sha256, Tensor methods)
is captured here *before* the candidate loads and re-checked for identity after every call.
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from gpu_worker import protocol
from gpu_worker.timing_inputs import FreshValues, check_entries


def _redirect(tmp: str) -> None:
    fd = os.open(os.path.join(tmp, "log.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def apply_limits(spec: str | None) -> None:
    """The limits the parent asks for (sandbox.Sandbox: MARATHON_CHILD_LIMITS, JSON), set by the child
    itself before anything else runs in it: no core dumps, the cores it may use, and an address-space
    cap where no CUDA mappings need the room (the interpreter)."""
    import json
    import resource

    if not spec:
        return
    lim = json.loads(spec)
    if lim.get("core") is not None:
        resource.setrlimit(resource.RLIMIT_CORE, (lim["core"], lim["core"]))
    if lim.get("cpus"):
        os.sched_setaffinity(0, lim["cpus"])
    if lim.get("address_space"):
        resource.setrlimit(resource.RLIMIT_AS, (lim["address_space"], lim["address_space"]))


def main(argv: list[str]) -> int:
    fd_in, fd_out, tmp, role = int(argv[0]), int(argv[1]), argv[2], argv[3]
    apply_limits(os.environ.pop("MARATHON_CHILD_LIMITS", None))
    guard_fd = os.environ.pop("MARATHON_GUARD_FD", None)  # the guard's reports, read by the worker
    _redirect(tmp)
    from multiprocessing.connection import Connection

    import pickle

    class _Out:  # plain pickle: torch's ForkingPickler reductions would share memory through sockets
        def __init__(self, c):
            self.c = c

        def send(self, obj):
            self.c.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    class _In:
        def __init__(self, c):
            self.c = c

        def recv(self):
            return pickle.loads(self.c.recv_bytes())

    cin = _In(Connection(fd_in, writable=False))
    cout = _Out(Connection(fd_out, readable=False))
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import triton  # noqa: F401

    server = Server(tmp, role)
    server.guard_fd = int(guard_fd) if guard_fd else None
    cout.send(protocol.Ready(ready=True, cuda=server.cuda, pid=os.getpid(),
                             import_s=time.perf_counter() - t0).model_dump())
    while True:
        try:
            msg = cin.recv()
        except EOFError:
            return 0
        except Exception as e:  # noqa: BLE001 - bytes that are no pickle: refused like any malformed request
            cout.send(protocol.reply_to_wire(None, failure=protocol.Failure(
                kind="protocol", error=f"unreadable request: {type(e).__name__}: {e}")))
            continue
        seq = msg.get("seq") if isinstance(msg, dict) else None  # echoed: no reply is taken for another
        seq = seq if type(seq) is int else None
        try:
            request = protocol.parse_request(msg)
        except protocol.ProtocolError as e:
            cout.send(protocol.reply_to_wire(seq, failure=protocol.Failure(kind="protocol", error=str(e))))
            continue
        if isinstance(request, protocol.Exit):
            cout.send(protocol.reply_to_wire(seq, protocol.Empty()))
            return 0
        result, failure = None, None
        try:
            result = serve(server, request)
        except Refused as e:
            failure = protocol.Failure(kind=e.kind, error=e.error)
        except BaseException as e:  # noqa: BLE001 - every failure becomes a structured reply
            failure = server.describe_failure(e)
        # the device memory it holds goes with every reply (scheduling.DeviceMemory counts it); a trusted
        # reference child also reads the whole device, which calibrates that budget
        wire = protocol.reply_to_wire(seq, result, failure, server.violations(), server.reserved(),
                                      server.device_free() if server.role == "reference" else None)
        try:
            cout.send(wire)
        except Exception as e:  # noqa: BLE001 - a reply that does not pickle
            cout.send(protocol.reply_to_wire(seq, failure=protocol.Failure(
                kind="exception", error=f"reply could not be sent: {e}"), violations=server.violations()))
        if failure is not None and failure.fatal:
            return 3


class Refused(Exception):
    """A command the child will not carry out as asked (a contract the candidate breaks, a step out of
    order): its failure reply says `kind` and `error`, and the child goes on serving."""

    def __init__(self, kind: str, error: str):
        super().__init__(error)
        self.kind, self.error = kind, error


def serve(server: "Server", request: protocol.Request) -> protocol.Result:
    """One request, by the dispatch table: its handler gets the request's fields as arguments."""
    handler = COMMANDS[type(request)]
    return handler(server, **{name: getattr(request, name) for name in type(request).model_fields})


# ------------------------------------------------------------------------------------------------


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


FINGERPRINT_CHUNK = 1 << 24  # elements per step of a fingerprint: its temporaries stay at 64 MB in fp32


@dataclass
class TimingSet:
    """One distribution's timing state: static buffers (what graphs read and write), the value pool, and
    what derives a repetition's values from it (gpu_worker.timing_inputs: an entry's values are a pool set
    perturbed by draws seeded from the benchmark's noise seed and the entry)."""

    key: tuple
    sets: list  # [(inputs, outputs)] static buffers, one graph each when captured
    pool: list  # [inputs] value sets the static inputs' values are made from
    fresh: FreshValues
    graphs: list | None = None
    # per static set, its output buffers as the harness allocated them: what is poisoned, kept and
    # fingerprinted, whatever the candidate does to the dicts it is handed
    outs: list = field(default_factory=list)

    def values(self, e: int, noise_seed: int) -> dict:
        return self.fresh(self.pool, e, noise_seed)


class Server:
    def __init__(self, tmp: str, role: str):
        import hashlib

        import torch

        self.tmp, self.role = tmp, role
        self.cuda = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
        self.device = "cuda" if self.cuda else "cpu"
        self.cuda_ready = False
        self.triton_warm = False  # Triton's per-process keys computed (cmd_warm_triton)
        self.module = None
        self.ran = False  # the candidate has run for real here: its kernels are loaded (see cmd_prepare)
        self.problem = None
        self.shape = None
        self.cpu_mode = not self.cuda
        self.bank_tag = None
        self._prefetched: dict = {}
        self._staged: dict = {}  # (dist, seed) -> host inputs read or generated ahead (cmd_stage), taken once
        self._verifying: dict | None = None  # a verification's state between its steps (cmd_verify_case ...)
        self._pending: list = []  # (tag, outputs, device copies, handles) of verify calls, see cmd_export
        self._to_write: list = []  # (host bytes, path) downloaded, not yet written: see cmd_write_exports
        self._to_check: list = []  # (tag, outputs as downloaded, copies taken after the call): cmd_write_exports
        # reference role: per static output set (the id of its dict), what the timed baseline returned last;
        # a graph's replays rewrite the tensors it returned when captured
        self.base_outputs: dict = {}
        self.prep_timing: dict = {}
        self.timing: dict[str, TimingSet] = {}  # distribution -> its timing set (see the timing section)
        self.sleep_rate = None  # device spin cycles per millisecond (cmd_time's cushion)
        self.timed_outputs: list = []  # (pool index, outputs) of timed calls picked at random, see cmd_time
        self.oracles: OrderedDict = OrderedDict()  # reference role: (dist, seed) -> oracle outputs, see _oracle
        self.flush = None
        self.flush_graph = None
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

    def cmd_cuda_init(self):
        """Create this child's CUDA context. The worker asks for it under its GPU gate's shared side (a
        spare does it while it waits), so the context is never created while another job is being timed,
        nor later under the exclusive lock."""
        if self.cuda and not self.cuda_ready:
            import torch

            torch.empty(1, device="cuda")
            torch.cuda.synchronize()
            self.cuda_ready = True
        return protocol.CudaReady(cuda=self.cuda)

    def cmd_warm_triton(self):
        """Triton's per-process keys, after the context: host work only (file hashes, `ptxas --version`),
        so the worker asks for it outside its GPU gate. Inside the gate it made compiles hold the shared
        side ~6 s each, and every timing request waited for such holds to drain."""
        if self.cuda and not self.triton_warm:
            _warm_triton()
            self.triton_warm = True
        return protocol.Empty()

    def cmd_mem(self):
        """The peak reserved device memory since the last `mem` (one stage's footprint, which the worker's
        budget learns per stage; the peak restarts here) and the device's size. (What it holds now goes
        with every reply: `reserved`.)"""
        if not (self.cuda and self.cuda_ready):
            return protocol.MemoryPeak(peak=0, total=0)
        import torch

        peak = torch.cuda.max_memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        return protocol.MemoryPeak(peak=int(peak), total=int(torch.cuda.mem_get_info()[1]))

    def reserved(self) -> int:
        if not (self.cuda and self.cuda_ready):
            return 0
        import torch

        return int(torch.cuda.memory_reserved())

    def device_free(self) -> int | None:
        """Free memory of the whole device (every process's use counted), as the driver says now."""
        if not (self.cuda and self.cuda_ready):
            return None
        import torch

        return int(torch.cuda.mem_get_info()[0])

    # --- helpers ---------------------------------------------------------------------------------
    def violations(self):
        if self.role != "candidate":
            return []
        from gpu_worker import guard

        out = list(guard.VIOLATIONS)
        seal = getattr(self, "seal", None)
        if seal is not None:
            out += [v for v in seal.broken() if v not in out]
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

    def describe_failure(self, e: BaseException) -> protocol.Failure:
        from gpu_worker import guard

        tb = traceback.format_exc()
        print(tb, flush=True)
        text = f"{type(e).__name__}: {e}"
        kind, fatal = "exception", False
        low = text.lower()
        if isinstance(e, guard.GuardViolation):
            kind = "violation"
        elif "out of memory" in low or "can't allocate memory" in low or type(e).__name__ == "OutOfMemoryError":
            kind, fatal = "oom", True
        elif "illegal memory access" in low or "misaligned address" in low or "cuda error" in low \
                or "illegal instruction" in low or "unspecified launch failure" in low:
            kind, fatal = "cuda-error", True
        elif type(e).__name__ in ("CompilationError", "CompileTimeAssertionFailure") or "triton" in type(e).__module__:
            kind = "compile-error"
        return protocol.Failure(kind=kind, error=text[-4000:], traceback=tb[-6000:], fatal=fatal)

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

    def _inputs(self, dist: str, seed: int) -> dict:
        """Fresh device buffers holding one case's inputs."""
        import torch

        # prefetched sets (already on the device, see cmd_prepare) stay until the verification ends: the
        # determinism rerun and the stale-output probe get fresh copies of them instead of new inputs
        # generated and uploaded while the worker holds the GPU
        pre = self._prefetched.get((dist, seed))
        if pre is None:
            return self._to_device(self._host_inputs(dist, seed))
        here = torch.device(self.device).type

        def fresh(v):
            if not isinstance(v, torch.Tensor):
                return v
            return self.T["clone"](v) if v.device.type == here else self.T["to"](v, self.device)

        return {k: fresh(v) for k, v in pre.items()}

    def _to_device(self, inp: dict) -> dict:
        import torch

        return {k: (self.T["to"](v, self.device) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}

    def cmd_stage(self, cases: list):
        """Cases' inputs into host memory now, from the bank or generated (and banked, by the reference):
        host work, which the worker asks for outside its GPU gate; the upload that follows takes them."""
        t0 = self.T["perf"]()
        staged = {(d, s): self._host_inputs(d, s) for d, s in cases}  # (an earlier staging of a case is taken)
        self._staged = staged  # replaced, not added to: a staging no upload took is dropped here, not kept
        return protocol.Staged(seconds=round(self.T["perf"]() - t0, 4))

    def _host_inputs(self, dist: str, seed: int) -> dict:
        """One case's inputs in host memory. The reference child (trusted) generates them and leaves a
        read-only copy in the input bank; candidate children read that copy (memory-mapped, copy-on-write)
        instead of generating several hundred MB with the CPU each (KDA: ~1 s per case on one core, many children at
        once). The reference never reads the bank: its own fingerprint of each case is what the candidate's
        is checked against, so an altered bank file is a rejection, not a silent agreement."""
        import torch

        staged = self._staged.pop((dist, seed), None)
        if staged is not None:
            return staged
        path = self._bank_path(dist, seed)
        t0 = self.T["perf"]()
        if path and self.role == "candidate" and os.path.exists(path):
            try:
                inp = torch.load(path, mmap=True, weights_only=True)
                self._count("bank", t0)
                return inp
            except Exception as e:  # noqa: BLE001 - a bad bank file only costs the generation below
                print(f"input bank {path} unreadable ({type(e).__name__}: {e}); generating", flush=True)
        inp = self.make_inputs(self.shape, dist, seed, "cpu", cpu=self.cpu_mode)
        self._count("generate", t0)
        if path and self.role == "reference" and not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            try:
                torch.save(inp, tmp)
                os.chmod(tmp, 0o444)
                os.replace(tmp, path)  # atomic: a reader sees the whole file or none
            except OSError as e:  # a full /dev/shm: candidates generate their own, as before
                print(f"input bank write failed ({e})", flush=True)
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        return inp

    def _count(self, what: str, t0: float) -> None:
        """Seconds and count per step of input preparation, returned by cmd_prepare (the phase log)."""
        self.prep_timing[what] = self.prep_timing.get(what, 0.0) + self.T["perf"]() - t0
        self.prep_timing[what + "-n"] = self.prep_timing.get(what + "-n", 0) + 1

    def _bank_path(self, dist: str, seed: int) -> str | None:
        from baselines.problem import RANDOM_SHAPE

        root = os.environ.get("MARATHON_INPUT_BANK")
        if not root or self.bank_tag is None or self.shape.name.startswith(RANDOM_SHAPE):
            return None  # a random shape's inputs come from secret seeds, each used once
        key = repr((self.problem.name, self.shape.name, dist, int(seed), self.cpu_mode, self.bank_tag))
        return os.path.join(root, f"{self.problem.name}-{self.T['sha'](key.encode()).hexdigest()[:24]}.pt")

    @staticmethod
    def _generator_tag(problem) -> str | None:
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

    def _hash(self, inputs: dict) -> str:
        """Fingerprint of the inputs (shape, dtype, fp64 sum and sum of squares, a strided sample), computed
        on the device: it shows that the candidate and reference processes generated the same inputs.
        Mutation is checked exactly, against a pristine copy (see `_pristine` / `_mutated`)."""
        import torch

        h = self.T["sha"]()
        for k in sorted(inputs):
            v = inputs[k]
            h.update(k.encode())
            if isinstance(v, torch.Tensor):
                d = v.detach().reshape(-1)
                f = d.double()
                step = max(1, d.numel() // 4096)
                sample = self.T["to"](d[::step].double(), "cpu").numpy().tobytes()
                h.update(f"{v.dtype}{tuple(v.shape)}{float(f.sum())!r}{float((f * f).sum())!r}".encode())
                h.update(sample)
            else:
                h.update(repr(v).encode())
        return h.hexdigest()

    def _pristine(self, inputs: dict) -> dict:
        import torch

        return {k: self.T["clone"](v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}

    def _mutated(self, inputs: dict, pristine: dict) -> list[str]:
        """Names of inputs that differ bitwise from the copy taken before the call."""
        import torch

        bad = []
        for k, ref in pristine.items():
            v = inputs[k]
            if v.shape != ref.shape or v.dtype != ref.dtype:
                bad.append(k)
                continue
            a = self.T["view"](self.T["contiguous"](v).reshape(-1), torch.uint8)
            b = self.T["view"](ref.reshape(-1), torch.uint8)
            if not bool(torch.equal(a, b)):
                bad.append(k)
        return bad

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
        self.bank_tag = self._generator_tag(p)
        return p

    # --- candidate role --------------------------------------------------------------------------
    def cmd_load(self, source: str, problem: str, shape: str | None, write_roots: list, trusted_roots: list):
        import importlib.util

        from gpu_worker import guard

        assert self.role == "candidate"
        self._setup_problem(problem, shape)
        # hide the project's modules: a run-time import of them must go through the (refused) import system
        for name in [m for m in sys.modules if m.split(".")[0] in ("baselines", "activities", "workflows")]:
            del sys.modules[name]
        path = os.path.join(self.tmp, "candidate.py")
        with open(path, "w") as f:
            f.write(source)
        before = set(sys.modules)
        if self.cuda:  # Triton's per-process subprocesses (ldconfig, its driver module's build) run before the wall
            self.cmd_cuda_init()
            self.cmd_warm_triton()
        from gpu_worker import wall

        self.seal, self.wall = wall.enclose(self.tmp, list(write_roots), list(trusted_roots), self.cuda,
                                            getattr(self, "guard_fd", None))
        spec = importlib.util.spec_from_file_location("candidate", path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except OSError as e:
            self._refused_by_wall(e)
            raise
        guard.audit_modules(before)
        self.before_modules = before
        if not callable(getattr(mod, "run", None)):
            raise Refused("contract", "candidate defines no callable run(inputs, out)")
        self.module = mod
        self.kernels = self._kernel_objects()
        return protocol.Loaded(kernels=sorted(self.kernels), wall=self.wall)

    def _kernel_objects(self) -> dict:
        """name -> JITFunction-like object for every Triton kernel the module defines."""
        found = {}
        for name, obj in vars(self.module).items():
            f, depth = obj, 0
            while hasattr(f, "fn") and depth < 4 and not hasattr(f, "device_caches"):
                f, depth = f.fn, depth + 1
            if hasattr(f, "device_caches") or type(obj).__name__ in ("InterpretedFunction", "Autotuner", "Heuristics", "JITFunction"):
                found[getattr(getattr(f, "fn", f), "__name__", name)] = f
        return found

    def _call(self, inputs, outs, guarded: bool):
        from gpu_worker import guard

        try:
            if guarded:
                with guard.dispatch_guard():
                    self.module.run(inputs, outs)
            else:
                self.module.run(inputs, outs)
        except OSError as e:
            self._refused_by_wall(e)
            raise
        self._sync()
        guard.audit_modules(self.before_modules)
        for rule, detail in self.seal.broken():  # a mode left on torch's stacks, a rewritten guard
            raise guard.GuardViolation(rule, detail)

    def _refused_by_wall(self, e: OSError) -> None:
        """An act the OS wall refused (one the guard did not see first) becomes a violation of its family."""
        from gpu_worker import guard, wall

        family = wall.family_of(e, [self.tmp]) if self.wall.get("os") == "on" else None
        if family:
            self.seal.report(family, f"refused by the OS wall: {type(e).__name__}: {e}")
            raise guard.GuardViolation(family, f"refused by the OS wall: {e}") from e

    def cmd_compile(self, dist: str):
        """CUDA: compile every kernel the candidate launches without running it (Triton's warmup path,
        so compilation uses CPU cores, not the GPU), then report the compiler's view of each kernel.
        Interpreter: run once, which is where an interpreted kernel's errors surface."""
        self.prep_timing = {}
        # the worker uploaded this case beforehand (prepare, under its GPU gate); on CUDA nothing below
        # touches the device but the candidate's own host-side torch calls: Triton's warmup path compiles
        # without launching, and the outputs are not poisoned (their contents are never read here)
        pre = self._prefetched.get((dist, 0))
        inputs = self._inputs(dist, 0) if pre is None else self._to_device(pre)  # no copy when already there
        outs = self._outputs(poison=not self.cuda)
        t0 = time.perf_counter()
        if self.cuda:
            self._warmup_call(inputs, outs)
        else:
            self._call(inputs, outs, guarded=True)
        secs = time.perf_counter() - t0
        timing = {k: round(v, 4) for k, v in self.prep_timing.items()}
        timing["triton"] = round(secs, 4)
        del inputs, outs
        self._prefetched = {}
        self._release()  # this child may wait, kernels loaded, for the candidate's verification
        return protocol.Compiled(seconds=secs, kernels=self._compiled_info(), max_shared=self._max_shared(),
                                 timing=timing)

    def _max_shared(self) -> int | None:
        """The device's shared-memory limit per block (opt-in), as Triton sees it; None without CUDA.
        Triton's warmup path compiles kernels that need more without complaint (they fail at launch), so
        the harness compares each kernel's need with this at compile time."""
        if not self.cuda:
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

    def _load_kernels(self, inputs: dict, outs: dict) -> None:
        """Before the worker takes the GPU lock: find the candidate's kernels in Triton's cache and load
        them onto the device, so that the first timed or verified call does not pay for it under the lock.
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
                        p = os.path.join(self.tmp, f"{d['name']}-{len(info)}.cubin")
                        with open(p, "wb") as fh:
                            fh.write(cubin)
                        d["cubin_path"] = p
                    info.append(d)
        return info

    def cmd_prepare(self, cases: list | None = None, rotate: int | None = None, dist: str | None = None,
                    kernels: bool = True, seed: int = 1000, pool: int = 3):
        """Generate inputs ahead (on the CPU side, before the worker takes the GPU lock): the verification
        cases' inputs and/or the timing sets."""
        self.prep_timing = {}
        if cases:
            # uploaded now, before the exclusive lock (the worker holds its gate's shared side for this);
            # bounded so that many children at once stay within the device's memory
            host = {(d, s): self._host_inputs(d, s) for d, s in cases}
            nbytes = sum(v.numel() * v.element_size() for inp in host.values() for v in inp.values()
                         if hasattr(v, "element_size"))
            # only small sets wait on the device; larger ones are uploaded case by case during the run
            # (KDA's six cases are 1.9 GB, prefill's 6.8 GB: held per waiting child, they filled the device)
            limit = float(os.environ.get("MARATHON_PREFETCH_GB", "0.5")) * (1 << 30)
            t0 = self.T["perf"]()
            self._prefetched = {k: (self._to_device(v) if nbytes <= limit else v) for k, v in host.items()}
            self._sync()
            self._count("upload", t0)
            if kernels and self.cuda and self.module is not None:
                t0 = self.T["perf"]()
                self._load_kernels(self._inputs(*cases[0]), self._outputs())
                self._count("kernels", t0)
        if rotate:
            t0 = self.T["perf"]()
            self._prepare_timing(rotate, dist or self.problem.distributions[0], seed, pool)
            self._count("timing-sets", t0)
            # a child that has run the candidate (verified or timed it) has its kernels loaded already;
            # the pre-load is for a fresh one (it holds the GPU gate's shared side for seconds)
            if not cases and self.cuda and self.module is not None and not self.ran:
                t0 = self.T["perf"]()
                self._load_kernels(*self._timing_set(dist, "prepare").sets[0])
                self._count("kernels", t0)
        return protocol.Prepared(timing={k: round(v, 4) for k, v in self.prep_timing.items()})

    # Verification runs as one call per step (each case, the determinism rerun, the stale-output probe), so
    # that each step holds the worker's GPU gate on its own: a timing request waits for the shared holds to
    # drain, and one hold for all eight calls lasted 1.9 s on average on the H200.

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

    def _export(self, outs: dict, tag: str) -> dict:
        """A device copy of each output, taken now and kept for `cmd_export`, and the handles
        ({path, dtype, shape}) of the files it becomes, for the reference child, which compares them with
        the oracle on its device. Only a path crosses the pipes: pickling a 67 MB output through the worker
        twice per case cost more CPU than the whole verification's GPU time (KDA at T = 8192)."""
        # the copy goes to host memory at once (a device copy per output per case held a prefill
        # verification at ~17 GB and made the device memory the pipeline's bottleneck)
        snap = {k: self.T["to"](v.detach(), "cpu", copy=True) for k, v in outs.items()
                if type(v) is __import__("torch").Tensor}
        handles = self._handles(snap, tag)  # an output that is no plain Tensor is reported by out_type_ok
        self._pending.append((tag, outs, snap, handles))
        return handles

    def _handles(self, outs: dict, tag: str) -> dict[str, protocol.OutputHandle]:
        return {name: protocol.OutputHandle(path=os.path.join(self.tmp, f"out-{tag}-{name}.bin"),
                                            dtype=str(v.dtype).replace("torch.", ""), shape=tuple(v.shape))
                for name, v in outs.items()}

    def _download(self, snap: dict, handles: dict) -> None:
        """Device copies to host memory, queued for `cmd_write_exports` (the worker holds its GPU gate's
        shared side for the download only, not for the file writes)."""
        import torch

        for name, v in snap.items():
            flat = self.T["contiguous"](self.T["to"](v, "cpu")).reshape(-1)
            self._to_write.append((self.T["view"](flat, torch.uint8), handles[name].path))

    def cmd_write_exports(self):
        """Host work, outside the GPU gate: the late-write check of the outputs `export` downloaded, then
        the downloads' files. Returns the outputs that changed after their call returned."""
        t0 = self.T["perf"]()
        changed = []
        for tag, now, snap in self._to_check:  # bitwise, NaN-safe: the buffers as downloaded vs the copies
            changed += [f"{tag}/{name}" for name in self._mutated(now, snap)]
        self._to_check = []
        t1 = self.T["perf"]()
        for raw, path in self._to_write:
            raw.numpy().tofile(path)
        self._to_write = []
        return protocol.Exported(changed=changed,
                                 timing={"check": round(t1 - t0, 4), "write": round(self.T["perf"]() - t1, 4)})

    def cmd_export(self):
        """Download the outputs `verify` kept, for `write_exports`. They are the copies taken
        right after each call, and the candidate's own buffers must still equal them: an output that
        changed after the call returned means work outside the call (a late write), which is reported.
        The buffers are downloaded here, under the worker's GPU gate; `write_exports` compares them, on
        the host, without it."""
        import torch

        t0 = self.T["perf"]()
        changed = []
        for tag, outs, snap, handles in self._pending:
            if any(type(outs.get(name)) is not torch.Tensor for name in snap):
                changed += [f"{tag}/{name}" for name in snap if type(outs.get(name)) is not torch.Tensor]
            else:  # the buffers as they are now, for write_exports' comparison with the copies
                self._to_check.append((tag, {name: self.T["to"](outs[name].detach(), "cpu", copy=True)
                                             for name in snap}, snap))
            self._download(snap, handles)
        self._pending = []
        self._sync()
        self._release()
        return protocol.Exported(changed=changed, timing={"download": round(self.T["perf"]() - t0, 4)})

    # --- timing (both roles) -----------------------------------------------------------------------
    # A timing set is `rotate` static input/output buffer sets (one CUDA graph each, when captured) and a
    # pool of `pool` input value sets generated from the worker's timing seeds. Before every repetition,
    # outside the timed interval, a static set's inputs are refilled in place with its entry's values (a
    # pool set perturbed by draws of that entry's own: timing_inputs), its outputs are NaN-poisoned and L2
    # is flushed; the reference child holds the same pool, so any repetition's outputs can be compared
    # with the baseline's on the values that repetition saw. A graph that baked in a result computed
    # during capture, or a cache keyed on buffers or on contents, fails there.
    # The reference child keeps one timing set per distribution (benchmarks share it, each under its
    # lock); a candidate child keeps the one it is being timed on.

    def _prepare_timing(self, rotate: int, dist: str, seed: int = 1000, pool: int = 3):
        import torch

        key = (rotate, int(seed), pool)
        have = self.timing.get(dist)
        if have is not None and have.key == key:
            return
        if self.role == "candidate":
            self._drop_timing()
        else:
            self.timing.pop(dist, None)
            self.base_outputs.clear()  # the next timed call of each set fills its entry again
        if pool < 2:
            raise ValueError("a timing set needs at least two pool entries (every refill changes the values)")
        entries = [self._inputs(dist, int(seed) + k) for k in range(pool)]
        sets = [({k: (self.T["clone"](v) if isinstance(v, torch.Tensor) else v)
                  for k, v in entries[i % pool].items()}, self._outputs()) for i in range(rotate)]
        fresh = FreshValues(self.perturbed, dist, self.device, self.T["Generator"])
        self.timing[dist] = TimingSet(key=key, sets=sets, pool=entries, fresh=fresh,
                                      outs=[dict(out) for _, out in sets])
        if self.cuda and self.flush is None:
            from gpu_worker.devicetime import cold_bytes

            nbytes = cold_bytes()
            self.flush = torch.zeros(nbytes // 4, dtype=torch.float32, device="cuda")
            self.flush_sink = torch.zeros((), dtype=torch.float32, device="cuda")
            self.flush_graph = self._capture_flush()

    def _drop_timing(self):
        self.timing = {}

    def _timing_set(self, dist: str | None, what: str) -> "TimingSet":
        dist = dist or self.problem.distributions[0]
        ts = self.timing.get(dist)
        if ts is None:
            raise ValueError(f"{what} before the timing set of distribution {dist!r} was prepared")
        return ts

    def _fn(self):
        if self.role == "candidate":
            # the same dispatch guard as when verified: a timed call cannot be told from a checked one
            # (its host cost is no device time)
            from gpu_worker.guard import dispatch_guard

            run = self.module.run

            def run_guarded(inputs, out):
                with dispatch_guard():
                    run(inputs, out)

            return run_guarded
        base, last = self.baseline, self.base_outputs

        def run_baseline(inputs, out):  # its own outputs, not copied into `out`: the copy is no baseline work
            last[id(out)] = base(inputs)

        return run_baseline

    def _refill(self, inp: dict, src: dict) -> None:
        """In place: the static set's inputs take the pool entry's values (same buffers, new contents)."""
        import torch

        for k, v in inp.items():
            if isinstance(v, torch.Tensor):
                self.T["copy_"](v, src[k])

    def _poison(self, out: dict) -> None:
        import torch

        for v in out.values():
            if type(v) is torch.Tensor and v.is_floating_point():
                self.T["fill_"](v, float("nan"))

    def _flush_l2(self) -> None:
        # read, not written: a flush that leaves L2 full of dirty lines slows the next kernel (a float sum
        # reads the buffer once and writes one scalar; a widening sum would first write a widened copy)
        self.T["sum"](self.flush, 0, out=self.flush_sink)

    def _capture_flush(self):
        """The L2 flush as a CUDA graph, or None if it does not capture. A graph replayed right after
        stream work starts ~1 us later on the device than one replayed after another graph (2 us for a
        handful of kernels), which would lie inside the timed interval: graph-mode repetitions are
        preceded by this graph, as back-to-back replays are by each other."""
        import torch

        try:
            g = self.T["graph"]()
            with torch.cuda.graph(g):
                self._flush_l2()
            self.T["sync"]()
            return g
        except Exception as e:  # noqa: BLE001 - a flush that does not capture runs on the stream
            print(f"L2 flush not captured ({type(e).__name__}: {e}); it runs on the stream", flush=True)
            self.T["sync"]()
            return None

    def _before_rep(self, ts: "TimingSet", r: int, e: int, noise_seed: int, graph: bool = False) -> None:
        """Everything a repetition needs that is not timed, queued on the stream ahead of its events (and
        outside any captured graph): entry e's values into static set r, its outputs poisoned, and the L2
        flush last, launched the way the timed work is (`graph`: as a graph replay)."""
        self._refill(ts.sets[r][0], ts.values(e, noise_seed))
        self._poison(ts.outs[r])
        if self.cuda:
            if graph and self.flush_graph is not None:
                self.T["replay"](self.flush_graph)
            else:
                self._flush_l2()

    def cmd_capture(self, dist: str | None = None):
        """Capture one CUDA graph per static set; the reply says whether this side captures (the worker
        times graph replays only when every side of the comparison does)."""
        ts = self._timing_set(dist, "capture")
        ts.graphs = None
        if not self.cuda:
            return protocol.Captured(captured=False, why="no CUDA device")
        import torch

        fn = self._fn()
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # capture needs every lazy initialisation done: one call per set first
                for inp, out in ts.sets:
                    fn(inp, out)
            torch.cuda.current_stream().wait_stream(s)
            self.T["sync"]()
            graphs = []
            for inp, out in ts.sets:
                g = self.T["graph"]()
                with torch.cuda.graph(g):
                    fn(inp, out)
                graphs.append(g)
            self.T["sync"]()
        except Exception as e:  # noqa: BLE001 - a side that does not capture is timed back to back
            try:
                self.T["sync"]()
            except Exception:  # noqa: BLE001 - a broken context shows at the next call
                pass
            return protocol.Captured(captured=False, why=f"{type(e).__name__}: {str(e)[:300]}")
        ts.graphs = graphs
        return protocol.Captured(captured=True, why="")

    def _cycles_per_ms(self) -> float:
        """The device's spin rate for torch.cuda._sleep, measured once per process."""
        if self.sleep_rate is None:
            start, end = self.T["Event"](enable_timing=True), self.T["Event"](enable_timing=True)
            self.T["sleep"](1000)  # first launch outside the measurement
            self.T["record"](start)
            self.T["sleep"](2_000_000)
            self.T["record"](end)
            self.T["sync"]()
            self.sleep_rate = 2_000_000 / max(self.T["elapsed"](start, end), 1e-3)
        return self.sleep_rate

    def _projections(self, seed: int) -> dict:
        """Per compared floating-point output (as the problem specifies it, not as any tensor says), a
        vector of standard normal values drawn from `seed`, the same in every process for the same seed,
        device and size: the projection of an output onto it is that output's fingerprint (see
        `cmd_time`'s `check_seed`)."""
        import torch

        specs = self.problem.output_specs(self.shape, cpu=self.cpu_mode)
        g = self.T["Generator"](device=self.device)
        g.manual_seed(int(seed))
        out = {}
        for n in compared_outputs(self.problem, self.shape, self.cpu_mode):
            if not getattr(torch, specs[n].dtype).is_floating_point:
                continue
            size = math.prod(specs[n].shape)
            v = self.T["empty"](size, dtype=self.T["bfloat16"], device=self.device)  # half an fp32 vector's memory
            for c in range(0, size, FINGERPRINT_CHUNK):  # drawn chunk by chunk: no fp32 copy of the whole
                w = min(FINGERPRINT_CHUNK, size - c)
                self.T["copy_"](self.T["narrow"](v, 0, c, w),
                                self.T["randn"](w, generator=g, device=self.device, dtype=self.T["float32"]))
            out[n] = v
        return out

    def _fingerprint(self, outs: dict, proj: dict, squares: bool = False) -> list:
        """Each compared output projected onto its random vector, in fp32 chunks (device scalars; no
        synchronisation); with `squares`, [projection, sum of squares] per output, from the same chunks
        (the norm is the bound's scale). An output whose size is not its spec's fails here."""
        T, f32 = self.T, self.T["float32"]
        res = []
        for n, v in proj.items():
            flat = T["view"](T["contiguous"](outs[n]), -1)
            if flat.numel() != v.numel():
                raise ValueError(f"output {n!r} holds {flat.numel()} elements, its spec {v.numel()}")
            acc = sq = None
            for c in range(0, v.numel(), FINGERPRINT_CHUNK):
                w = min(FINGERPRINT_CHUNK, v.numel() - c)
                part = T["to"](T["narrow"](flat, 0, c, w), f32)
                d = T["dot"](part, T["to"](T["narrow"](v, 0, c, w), f32))
                acc = d if acc is None else T["add"](acc, d)
                if squares:
                    e = T["dot"](part, part)
                    sq = e if sq is None else T["add"](sq, e)
            res.append([acc, sq] if squares else acc)
        return res

    def _baseline_at(self, ts: "TimingSet", e: int, noise_seed: int) -> dict:
        """The baseline's outputs on entry e's values (each entry is met once: nothing is kept)."""
        outs = {k: v.detach() for k, v in self.baseline(ts.values(int(e), noise_seed)).items()}
        self._sync()
        return outs

    def cmd_time(self, reps: int, warmup: int = 3, mode: str = "back-to-back", keep_one: bool = False,
                 dist: str | None = None, check_seed: int | None = None, device_floor_ms: float = 0.0,
                 entries: list | None = None, noise_seed: int | None = None, first: int = 0):
        """Time `reps` repetitions on the prepared timing set; returns per-repetition device milliseconds.

        CUDA: the device first waits (a spin kernel) long enough for the host to stay ahead of it through
        the block (`cushion_ms`; `device_floor_ms`: a lower bound of the device's time per repetition);
        then each repetition is refill, poison, L2 flush, start event, the work (a graph replay in
        "cuda-graph" mode, an eager call in "back-to-back" mode), end event; one synchronize at the end.
        Host time therefore never lies between a repetition's events. Without CUDA the same steps run
        eagerly around perf_counter (the interpreter stand-in: its times say nothing about speed).

        Repetition i runs on entry first + i (the worker hands out each entry once per benchmark and side),
        its values derived from `noise_seed` (gpu_worker.timing_inputs); given `entries`, the timed
        repetitions run on those instead, after `warmup` from first on. Without a noise seed the child
        draws one of its own (values no other process can derive: no comparison).

        With `keep_one` the outputs of one repetition, picked at random, are copied for `export_timed`
        with the entry it ran on (the worker compares them with the baseline's on the same values).
        With `check_seed` every repetition's outputs are also fingerprinted after its end event (outside the
        timed interval, before the next refill): projected onto random vectors drawn from the seed. The
        reference role is given the candidate's block's `entries` and times the baseline on those, in
        that order, fingerprinting on the same vectors and adding each output's norm: the worker compares
        the two call by call, and no baseline call is spent on the comparison alone."""
        T = self.T
        perf = T["perf"]
        ts = self._timing_set(dist, "time")
        if mode == "cuda-graph" and ts.graphs is None:
            raise ValueError("cuda-graph timing asked of a side that did not capture")
        fn = self._fn()
        rotate, warmup = len(ts.sets), max(warmup, 1)
        noise_seed, first = self._noise(noise_seed, first, shared=entries is not None or check_seed is not None)
        warm = list(range(first, first + warmup))
        if entries is not None:
            entries = check_entries(entries, avoid=range(first, first + warmup))
            reps = len(entries)
        elif type(reps) is not int or reps < 1:
            raise ValueError(f"reps must be a positive int, got {reps!r}")
        else:
            entries = list(range(first + warmup, first + warmup + reps))
        order = [(i % rotate, e) for i, e in enumerate(warm + entries)]
        # every timed repetition ran on values its buffers never held (at capture they held a pool set
        # itself): a result fixed then, or cached per buffer or per content, cannot be right there
        pick = int.from_bytes(T["urandom"](4), "little") % reps if keep_one else -1

        def launch(r: int):
            if mode == "cuda-graph":
                T["replay"](ts.graphs[r])
            else:
                fn(*ts.sets[r])

        def keep(i: int, r: int, j: int):
            if i == pick:
                self.timed_outputs.append((j, {k: T["clone"](v) for k, v in ts.outs[r].items()}))

        timed = order[warmup:]
        proj = self._projections(check_seed) if check_seed is not None else None
        reference = self.role == "reference"
        fps: list = []

        def check(r: int, into: list | None):
            if proj is not None:
                outs = self.base_outputs[id(ts.sets[r][1])] if reference else ts.outs[r]
                f = self._fingerprint(outs, proj, squares=reference)
                if into is not None:
                    into.append(f)

        host_rep_ms = 0.0
        for n, (r, j) in enumerate(order[:warmup]):
            if self.cuda and n == warmup - 1:
                T["sync"]()
                t0 = perf()  # how long the host takes to queue one repetition: the device's wait covers the block
            self._before_rep(ts, r, j, noise_seed, graph=mode == "cuda-graph")
            launch(r)
            check(r, None)  # queued like a timed repetition's, so the host's queueing time counts it
            if self.cuda and n == warmup - 1:
                host_rep_ms = (perf() - t0) * 1e3
        times = []
        if not self.cuda:
            for i, (r, j) in enumerate(timed):
                self._before_rep(ts, r, j, noise_seed)
                t0 = perf()
                launch(r)
                times.append((perf() - t0) * 1e3)
                keep(i, r, j)
                check(r, fps)
            return protocol.Timed(times=times, mode="interpreter" if self.role == "candidate" or self.cpu_mode else "cpu",
                                  checks=self._checks(timed, fps, proj, reference), check_names=list(proj or {}))
        T["sync"]()
        from gpu_worker.timing import cushion_ms

        starts = [T["Event"](enable_timing=True) for _ in timed]
        ends = [T["Event"](enable_timing=True) for _ in timed]
        T["sleep"](int(cushion_ms(host_rep_ms, len(timed), device_floor_ms) * self._cycles_per_ms()))
        for i, (r, j) in enumerate(timed):
            self._before_rep(ts, r, j, noise_seed, graph=mode == "cuda-graph")
            T["record"](starts[i])
            launch(r)
            T["record"](ends[i])
            keep(i, r, j)
            check(r, fps)
        T["sync"]()
        times = [T["elapsed"](s, e) for s, e in zip(starts, ends)]
        self.ran = True
        return protocol.Timed(times=times, mode=mode, checks=self._checks(timed, fps, proj, reference),
                              check_names=list(proj or {}))

    @staticmethod
    def _checks(timed: list, fps: list, proj: dict | None, squares: bool) -> list:
        """[entry, [fingerprint per compared output]] per timed repetition, with [its norm per compared
        output] in the reference role (whose fingerprints carry their sums of squares); empty without a seed."""
        if proj is None:
            return []
        out = []
        for (_, j), f in zip(timed, fps):
            if squares:
                out.append([j, [float(p) for p, _ in f], [math.sqrt(float(q)) for _, q in f]])
            else:
                out.append([j, [float(x) for x in f]])
        return out

    def _noise(self, noise_seed: int | None, first: int, shared: bool) -> tuple[int, int]:
        """(noise seed, first entry): the worker's, or, where no other process needs the values (`shared`
        false), a seed of this child's own drawn now."""
        if noise_seed is None:
            if shared:
                raise ValueError("entries and check_seed need the benchmark's noise_seed: without it no other "
                                 "process derives the values a repetition ran on")
            return int.from_bytes(self.T["urandom"](6), "little"), 0
        if type(first) is not int or first < 0:
            raise ValueError(f"first must be a non-negative int, got {first!r}")
        return int(noise_seed), first

    def cmd_host_latency(self, reps: int = 10, dist: str | None = None, noise_seed: int | None = None,
                         first: int = 0):
        """Host latency of a synchronous call (milliseconds from the call to the end of a synchronize,
        L2 flushed before it): what a caller waits, launch overhead included. Reported beside the device
        time, never inside a speedup. Call i runs on entry first + i."""
        ts = self._timing_set(dist, "host latency")
        fn = self._fn()
        perf = self.T["perf"]
        noise_seed, first = self._noise(noise_seed, first, shared=False)
        walls = []
        for i in range(reps):
            r = i % len(ts.sets)
            self._before_rep(ts, r, first + i, noise_seed)
            self._sync()
            t0 = perf()
            fn(*ts.sets[r])
            self._sync()
            walls.append((perf() - t0) * 1e3)
        return protocol.HostLatency(walls=walls)

    def cmd_park(self):
        """Drop the timing sets and the flush buffer before this child waits, kept, for a later benchmark:
        they cost ~0.3 s to make again and ~1.4 GB (KDA) of device memory to keep per waiting child."""
        self._drop_timing()
        self.flush = self.flush_graph = None
        self._release()
        return protocol.Empty()

    def cmd_export_timed(self):
        """Download the timed calls' kept outputs (see cmd_time) for `write_exports`; returns the jobs
        whose files that writes (each names the pool entry its call ran on)."""
        jobs = []
        for n, (idx, kept) in enumerate(self.timed_outputs):  # already copies (cmd_time's keep)
            handles = self._handles(kept, f"timed{n}")
            self._download(kept, handles)
            jobs += [protocol.TimedJob(entry=idx, name=name, out=h) for name, h in handles.items()]
        self.timed_outputs = []
        self._release()
        return protocol.TimedExported(jobs=jobs)

    def cmd_profile(self, reps: int = 10, dist: str | None = None, noise_seed: int | None = None, first: int = 0):
        """torch.profiler (CUPTI) over the timed loop's steps, once with the work and once without it: the
        difference is the work's device kernel time per call, which the worker compares with the judged
        device time. Also returns the kernel names the work launched. Each refill takes the next entry from
        `first` on (2 + 2 x reps of them)."""
        from torch.profiler import ProfilerActivity, profile

        ts = self._timing_set(dist, "profile")
        fn = self._fn()
        rotate = len(ts.sets)
        noise_seed, first = self._noise(noise_seed, first, shared=False)
        entry = iter(range(first, first + 2 + 2 * reps))
        for i in range(2):
            self._before_rep(ts, i % rotate, next(entry), noise_seed)
            fn(*ts.sets[i % rotate])
        self._sync()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])

        def device_events(with_work: bool) -> dict:
            with profile(activities=acts) as prof:
                for i in range(reps):
                    self._before_rep(ts, i % rotate, next(entry), noise_seed)
                    if with_work:
                        fn(*ts.sets[i % rotate])
                self._sync()
            kernels: dict[str, list] = {}
            for ev in prof.events():
                if self.cuda and "CUDA" in str(getattr(ev, "device_type", "")) and getattr(ev, "device_time", None) is not None:
                    k = kernels.setdefault(ev.name, [0.0, 0])
                    k[0] += ev.device_time / 1e3  # us -> ms
                    k[1] += 1
            return kernels

        with_work, without = device_events(True), device_events(False)
        total = (sum(v[0] for v in with_work.values()) - sum(v[0] for v in without.values())) / reps
        launches = (sum(v[1] for v in with_work.values()) - sum(v[1] for v in without.values())) / reps
        work = {k: (v[0] - without.get(k, [0.0, 0])[0]) / reps for k, v in with_work.items()
                if v[1] > without.get(k, [0.0, 0])[1]}
        return protocol.Profiled(kernels=work, kernel_ms_per_call=total, launches_per_call=launches)

    # --- reference role --------------------------------------------------------------------------
    def cmd_setup(self, problem: str, shape: str | None):
        assert self.role == "reference"
        p = self._setup_problem(problem, shape)
        bases = p.baselines()
        self.baseline_name, self.baseline = next(iter(bases.items()))
        return protocol.SetUp(baseline=self.baseline_name, shape=self.shape.name, cuda=self.cuda)

    def _oracle(self, dist: str, seed: int, inputs: dict | None = None) -> dict:
        """The oracle's outputs for one case, kept on this child's device (LRU within
        MARATHON_ORACLE_CACHE_GB, default 24 on CUDA, 2 on the CPU) so that every later candidate is
        compared there, in fp64, without the oracle crossing a pipe."""
        cache = self.oracles
        key = (dist, seed)
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        if inputs is None:
            inputs = self._inputs(dist, seed)
        ref = {k: v.detach() for k, v in self.problem.oracle(inputs).items() if k in self.outputs}
        cache[key] = ref
        limit = float(os.environ.get("MARATHON_ORACLE_CACHE_GB", "24" if self.cuda else "2")) * (1 << 30)

        def nbytes():
            return sum(t.numel() * t.element_size() for r in cache.values() for t in r.values())

        while len(cache) > 1 and nbytes() > limit:
            cache.popitem(last=False)
        return ref

    def cmd_reference(self, cases: list, baseline: bool = True):
        """Per case: the inputs' fingerprint and the baseline's own error against the oracle (NaN without
        `baseline`: the baseline is not run); the oracle stays here, on the device, for `compare`."""
        from baselines.problem import rel_rms

        out = []
        for dist, seed in cases:
            t0 = time.perf_counter()
            inputs = self._inputs(dist, seed)
            h = self._hash(inputs)
            self._sync()
            t1 = time.perf_counter()
            ref = self._oracle(dist, seed, inputs)
            self._sync()
            t2 = time.perf_counter()
            base = self.baseline(inputs) if baseline else None  # a first call compiles and autotunes
            self._sync()
            t3 = time.perf_counter()
            errs = [rel_rms(ref[k], base[k]) for k in self.outputs] if baseline else [math.nan]
            out.append(protocol.ReferenceCase(dist=dist, seed=seed, hash=h, baseline_err=max(errs),
                                              timing={"inputs": t1 - t0, "oracle": t2 - t1, "baseline": t3 - t2}))
        return protocol.References(cases=out)

    def _import(self, handle: protocol.OutputHandle):
        """A tensor written by a candidate child's `_export`, on this child's device."""
        import torch

        dtype = getattr(torch, handle.dtype)
        nbytes = math.prod(handle.shape) * torch.empty((), dtype=dtype).element_size()
        if os.path.getsize(handle.path) != nbytes:
            raise ValueError(f"output file {handle.path} holds {os.path.getsize(handle.path)} bytes, "
                             f"expected {nbytes}")
        raw = torch.from_file(handle.path, shared=False, size=nbytes, dtype=torch.uint8)
        return raw.view(dtype).reshape(handle.shape).to(self.device)

    def cmd_compare_timed(self, jobs: list, noise_seed: int, dist: str | None = None):
        """Each job: a candidate's output from a timed call that ran on entry `set` of the timing set of
        `dist` (its values derived from `noise_seed`), compared with the baseline's output on the same
        values. Returns rel-RMS and non-finite count per job."""
        import torch

        from baselines.problem import rel_rms

        ts = self._timing_set(dist, "compare_timed")
        res, last = [], [None, None]
        for job in jobs:
            o = self._import(job.out)  # one output on the device at a time
            if last[0] != job.entry:  # a call's outputs come together: the baseline runs once per entry
                last = [job.entry, self._baseline_at(ts, job.entry, noise_seed)]
            ref = last[1][job.name]
            of = o.double()
            res.append(protocol.TimedComparison(rel_err=rel_rms(ref, of), nonfinite=int((~torch.isfinite(of)).sum())))
            o = of = None  # noqa: F841 - freed before the next output is read, and before the release below
        self._release()
        return protocol.TimedCompared(results=res)

    def cmd_compare(self, jobs: list):
        """Each job compares one output file (`out`) with the oracle of `case` ([dist, seed]) or with
        another output file (`other`, the determinism rerun). Returns per job: rel_err (rel-RMS in fp64,
        NaN if anything is non-finite), nonfinite (count in the output), constant (the output is constant
        where the reference is not)."""
        import torch

        from baselines.problem import rel_rms

        res = []
        t_import = t_math = 0.0
        perf = self.T["perf"]
        for job in jobs:
            t0 = perf()
            o = self._import(job.out)  # one output on the device at a time
            t_import += perf() - t0
            t0 = perf()
            if job.case is not None:
                t = self._oracle(*job.case)[job.name]
            else:
                t = self._import(job.other)
            of = o.double()
            nonfinite = int((~torch.isfinite(of)).sum())
            constant = bool(of.numel() > 1 and float(of.std()) == 0.0 and float(t.double().std()) > 0.0)
            res.append(protocol.Comparison(rel_err=rel_rms(t, of), nonfinite=nonfinite, numel=o.numel(),
                                           constant=constant))
            del o, of
            t_math += perf() - t0
        self._release()  # the imported outputs are gone: their blocks go back, the worker's budget sees it
        return protocol.Compared(results=res, timing={"import": round(t_import, 4), "oracle-and-math": round(t_math, 4)})

    def cmd_ceilings(self):
        """Measured ceilings for the physical floor: device-to-device copy bandwidth (read + write bytes)
        and bf16 matmul rate. CUDA only."""
        import torch

        if not self.cuda:
            return protocol.Ceilings(bandwidth=None, flops=None)
        n = 1 << 28  # 1 GiB of fp32
        a = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
        b = torch.empty_like(a)
        for _ in range(3):
            b.copy_(a)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(10):
            s.record(); b.copy_(a); e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        bw = 2 * 4 * n / (ts[0] / 1e3)
        del a, b
        m = 8192
        x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            x @ y
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            s.record(); x @ y; e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        fl = 2 * m ** 3 / (ts[0] / 1e3)
        return protocol.Ceilings(bandwidth=bw, flops=fl)

    def cmd_receipt(self):
        import subprocess

        import torch
        import triton

        d = {"torch": torch.__version__, "triton": triton.__version__, "device": "cpu (Triton interpreter)",
             "driver": "", "clocks": ""}
        if self.cuda:
            d["device"] = torch.cuda.get_device_name(0)
            try:
                q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw",
                                    "--format=csv,noheader", "-i", "0"], capture_output=True, text=True, timeout=10)
                f = [x.strip() for x in q.stdout.strip().split(",")]
                d["driver"] = f[0]
                d["clocks"] = f"sm {f[1]} (max {f[3]}), mem {f[2]}, {f[4]} C, {f[5]}"
            except Exception as e:  # noqa: BLE001
                d["clocks"] = f"nvidia-smi unavailable: {e}"
        return protocol.ReceiptFacts(**d)


#: the dispatch table: every request type the child serves (all of gpu_worker.protocol's but Exit, which
#: the serving loop answers itself) and its handler
COMMANDS: dict[type[protocol.Request], Callable[..., protocol.Result]] = {
    protocol.CudaInit: Server.cmd_cuda_init,
    protocol.WarmTriton: Server.cmd_warm_triton,
    protocol.Mem: Server.cmd_mem,
    protocol.Stage: Server.cmd_stage,
    protocol.Load: Server.cmd_load,
    protocol.Compile: Server.cmd_compile,
    protocol.Prepare: Server.cmd_prepare,
    protocol.VerifyCase: Server.cmd_verify_case,
    protocol.VerifyRerun: Server.cmd_verify_rerun,
    protocol.VerifyStale: Server.cmd_verify_stale,
    protocol.VerifyReply: Server.cmd_verify_reply,
    protocol.Export: Server.cmd_export,
    protocol.WriteExports: Server.cmd_write_exports,
    protocol.ExportTimed: Server.cmd_export_timed,
    protocol.Capture: Server.cmd_capture,
    protocol.Time: Server.cmd_time,
    protocol.HostLatencyRequest: Server.cmd_host_latency,
    protocol.Park: Server.cmd_park,
    protocol.Profile: Server.cmd_profile,
    protocol.Setup: Server.cmd_setup,
    protocol.Reference: Server.cmd_reference,
    protocol.Compare: Server.cmd_compare,
    protocol.CompareTimed: Server.cmd_compare_timed,
    protocol.MeasureCeilings: Server.cmd_ceilings,
    protocol.Receipt: Server.cmd_receipt,
}


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

