"""The evaluator: compile, verify, benchmark, profile and self-test candidates, independent of Temporal.

Process layout (why the numbers can be trusted):

* this process (the worker) owns statistics, thresholds and decisions; it never loads candidate code;
* one *reference* child per (problem, shape) computes the oracle and the primary baseline's outputs, keeps
  the oracle on its device and compares every candidate output with it there, and times the baseline; it
  is trusted code only;
* every candidate is loaded into a fresh *candidate* child (single use) whose guard was installed before
  the candidate's module executed. Timing inside that child uses event/synchronize/perf_counter objects
  captured before the load and re-checked for identity after every call; a new best is additionally
  re-measured in another fresh child and cross-checked against torch.profiler's kernel time.

All rejections are returned as reports; only infrastructure failures (artifact store) raise.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import random
import secrets
import threading
import time
from typing import Callable

from workflows.artifacts import ArtifactStore
from rules.check import check_source
from gpu_worker.phases import Heartbeat, phases_begin, phases_end  # noqa: F401 - the activities read them here
from gpu_worker.phases import add_phase as _add_phase
from gpu_worker.phases import phase as _phase
from gpu_worker.phases import waiting_heartbeat as _waiting_heartbeat
from gpu_worker.sandbox import Rejection, Sandbox, SandboxFailure
from gpu_worker.sass import scan_sass
from gpu_worker.timing import (another_block, choose_mode, crosscheck, decide, distribution_figures, foreign_kernels,
                               median, shown_slower)
from workflows.contracts import (BenchReport, BenchRequest, CompileReport, DeviceFacts, DistributionTiming,
                                 EvalRequest, ProfileReport, Receipt, VerifyReport)

#: seeds of verification inputs come from this pool (a candidate sees 3 of them, chosen by its id), so
#: inputs differ between candidates while the oracle cache still hits
SEED_POOL = int(os.environ.get("MARATHON_SEED_POOL", "16"))
N_SEEDS = 3
LOG_LIMIT = 12000
RANDOM_SLACK = 2.0  # a random shape's threshold, in multiples of the verified shape's (_verify_random_shape)
# the verdicts of a verification that say the kernel's answer is wrong (at a random shape: shape-specific)
SHAPE_WRONG = ("wrong:", "non-finite:", "degenerate:", "nondeterministic:", "output-cache:", "late-write:")
FINGERPRINT_SIGMAS = 6.0  # a timed call's projection may be off by this many bounds (see _check_fingerprints)


def cuda_available() -> bool:
    if os.environ.get("MARATHON_FORCE_INTERPRETER") == "1":
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def other_shapes(problem, verified) -> list[str]:
    """The problem's shapes other than `verified`, cheapest first (by the bytes of their outputs): a
    kernel correct only at the shape it was verified at fails at the first of them."""
    import math

    def cost(shape) -> int:
        return sum(math.prod(o.shape) for o in problem.output_specs(shape).values())

    return [s.name for s in sorted((s for s in problem.shapes if s.name != verified.name), key=cost)]


def _check_entries(checks: list, reps: int, expected: list) -> None:
    """A candidate child's report of its timed calls, before the baseline is run on the entries it names:
    one [entry, fingerprints] per timed call, the entries the ones the worker handed it, in order."""
    if not checks:
        return
    ok = len(checks) == reps and all(
        isinstance(c, list) and len(c) == 2 and type(c[0]) is int and isinstance(c[1], list)
        and all(type(x) is float for x in c[1]) for c in checks) and [c[0] for c in checks] == list(expected)
    if not ok:
        raise Rejection("benchmark", f"timed-output: the candidate's process reported {len(checks)} timed calls "
                        f"for {reps} timings, or other entries than it was given: its report was altered")


def _mem_shape(shape) -> str:
    """The shape's name in device-memory admission: random shapes share one, learned as the largest."""
    from baselines.problem import RANDOM_SHAPE

    return "random" if shape.name.startswith(RANDOM_SHAPE) else shape.name


def shared_over_limit(kernels: list[dict], limit: int | None) -> str | None:
    """The compile rejection for kernels that need more shared memory than the device gives a block
    (they compile, then fail at their first launch, which would be under the GPU lock), else None."""
    if not limit:
        return None
    over = [k for k in kernels if (k.get("shared") or 0) > limit]
    if not over:
        return None
    k = max(over, key=lambda k: k["shared"])
    return (f"compile-error: OutOfResources: {k.get('name')} needs {k['shared']} bytes of shared memory, the "
            f"device allows {limit} per block (lower BLOCK sizes or num_stages)")


class NoGate:
    """The GPU gate of a serial caller: nothing to wait for. `shared(also=lock)` still takes `lock` (a
    reference child serves one call at a time)."""

    def shared(self, also: threading.Lock | None = None):
        return also if also is not None else contextlib.nullcontext()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FreshChildren:
    """A new candidate child for every acquire: no warm spares."""

    def __init__(self, interpreter: bool):
        self.interpreter = interpreter

    def acquire(self) -> Sandbox:
        return Sandbox("candidate", self.interpreter)

    def close(self) -> None:
        pass


class NoHandOn:
    """No loaded child waits between stages: each stage loads its candidate in a child of its own."""

    def put(self, key, sb: Sandbox) -> None:
        sb.close()

    def take(self, key) -> Sandbox | None:
        return None

    def reserved(self) -> int:
        return 0

    def __len__(self) -> int:
        return 0

    def close(self) -> None:
        pass


class SerialScheduler:
    """The Evaluator's default scheduler, for one caller at a time: no GPU gate, no device-memory admission,
    no warm spares, no hand-on of loaded children, no core pinning. The GPU worker, which runs many
    evaluations at once, passes gpu_worker.scheduling.Scheduler instead; the verdicts are the same.

    The interface: `gate` (`with gate:` the exclusive side, `gate.shared(also=)` the shared side),
    `loaded` (put / take / reserved / close / len), `memory(carried)` (an admission with hold / alone /
    learn / total, or None), `pool(interpreter, ready)` (acquire / close), `spawn(role, interpreter)` and
    `pin(children, timed)`."""

    def __init__(self):
        self.gate = NoGate()
        self.loaded = NoHandOn()

    def memory(self, carried: Callable[[], int]):
        return None

    def pool(self, interpreter: bool, ready: Callable[[Sandbox], None] | None) -> FreshChildren:
        return FreshChildren(interpreter)

    def spawn(self, role: str, interpreter: bool) -> Sandbox:
        return Sandbox(role, interpreter)

    def pin(self, children, timed: bool) -> None:
        pass


class Evaluator:
    def __init__(self, store: ArtifactStore | None = None, interpreter: bool | None = None,
                 timeouts: dict | None = None, static_rules: bool = True, scheduler=None):
        self.store = store or ArtifactStore()
        self.interpreter = (not cuda_available()) if interpreter is None else interpreter
        self.cuda = not self.interpreter
        # the gate, admission, spares, hand-on and pinning (see SerialScheduler): the caller's choice
        self.sched = scheduler if scheduler is not None else SerialScheduler()
        self.gpu_lock = self.sched.gate  # timing, verification and profiling never share the GPU (scheduling.TimedLock)
        self._ceilings_lock = threading.Lock()  # the ceilings are measured once
        # a candidate's child goes on from compile to verify to benchmark (scheduling.LoadedChildren)
        self.loaded = self.sched.loaded
        self._refs: dict[tuple, tuple[Sandbox, threading.Lock, dict]] = {}
        self._refs_lock = threading.Lock()
        # per (problem, shape, dist, seed): the inputs' fingerprint and the baseline's own error. Small and
        # deterministic, so never evicted; the oracle itself lives in the reference child (child._oracle).
        self._ref_meta: dict[tuple, dict] = {}
        self._ref_meta_lock = threading.Lock()
        self.ceilings: dict | None = None
        scale = 1.0 if self.cuda else 3.0
        self.timeouts = {"load": 120 * scale, "compile": 300 * scale, "verify": 300 * scale, "time": 300 * scale,
                         "reference": 600 * scale, "profile": 300 * scale, **(timeouts or {})}
        self.selftest_result: dict | None = None
        # the timing values' seeds: drawn when the worker starts, from a space too large to precompute
        self.timing_seed = 1 << 20 | secrets.randbits(40)
        self._secret = random.SystemRandom()  # random shapes and their seeds: nothing the candidate can replay
        self._random_users: collections.Counter = collections.Counter()  # (problem, random shape) -> verifications
        self.static_rules = static_rules  # False only in tests of the run-time guard
        # candidates at once on one device stay within its memory (scheduling.DeviceMemory)
        self.mem = self.sched.memory(self._carried) if self.cuda else None
        # last: a CUDA pool's background thread readies spares through _cuda_init, which needs the above
        self.pool = self.sched.pool(self.interpreter, ready=self._cuda_init if self.cuda else None)

    def close(self):
        self.pool.close()
        self.loaded.close()
        with self._refs_lock:
            for sb, _, _ in self._refs.values():
                sb.close(graceful=True)
            self._refs.clear()

    # --- helpers ---------------------------------------------------------------------------------
    def _problem(self, name: str):
        from baselines.registry import get_problem

        return get_problem(name)

    def _shape(self, problem, shape_name):
        if shape_name is None:
            return problem.shapes[0] if self.cuda else problem.cpu_shape
        found = problem.shape_named(shape_name)
        if found is not None:
            return found
        raise Rejection("verify", f"problem {problem.name} has no shape {shape_name!r}; shapes: "
                        + ", ".join(s.name for s in list(problem.shapes) + [problem.cpu_shape]))

    @staticmethod
    def _child_key(problem: str, shape, source_key: str) -> tuple:
        # the artifact store is content-addressed: one key, one source, so a kept child can only ever be
        # handed the candidate it holds
        if not source_key:
            raise ValueError("a loaded child is keyed by its candidate's source key")
        return (problem, shape.name, source_key)

    def _source(self, key: str) -> str:
        return self.store.get_text(key)  # ArtifactStoreError propagates: infrastructure

    def _log(self, text: str) -> str | None:
        if not text:
            return None
        if len(text) > LOG_LIMIT:
            text = text[:2000] + "\n...[trimmed]...\n" + text[-(LOG_LIMIT - 2000):]
        return self.store.put_text(text)  # ArtifactStoreError propagates: infrastructure

    def cases(self, problem, candidate_id: str) -> list[tuple[str, int]]:
        rng = random.Random(candidate_id)
        seeds = sorted(rng.sample(range(SEED_POOL), N_SEEDS))
        return [(d, s) for s in seeds for d in problem.distributions]

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
                    self._ref_do(sb, hb, "cuda_init", self.timeouts["load"])
                with lock:
                    if not info:
                        self._ref_do(sb, hb, "warm_triton", self.timeouts["load"])
                        info.update(self._ref_do(sb, hb, "setup", self.timeouts["load"], problem=problem.name,
                                                 shape=shape.name))
            except RuntimeError:
                sb.close()
                raise
        return entry

    def _ref_call(self, problem, shape, hb, cmd, timeout, gate: str = "shared", **kw) -> dict:
        """One call to the reference child with its lock and the GPU gate's `gate` side ("shared" or
        "exclusive"; see _with_ref)."""
        sb, lock, _ = self._ref(problem, shape, hb)
        with self._with_ref(lock, gate):
            return self._ref_do(sb, hb, cmd, timeout, **kw)

    @staticmethod
    def _ref_do(sb: Sandbox, hb, cmd: str, timeout, **kw) -> dict:
        """The call itself, its lock and gate side already held."""
        t = time.monotonic()
        try:
            r = sb.call(cmd, timeout, hb, **kw)
        except SandboxFailure as f:
            # the trusted child failed (or was killed by an interrupted call, Sandbox.call): a harness error,
            # which the activity's retry meets with a new reference child, never the candidate's rejection
            raise RuntimeError(f"reference process {cmd} failed: {f}") from f
        _add_phase(f"ref.{cmd}", time.monotonic() - t)
        if not r.get("ok"):
            raise RuntimeError(f"reference process {cmd} failed: {r.get('error')}\n{r.get('traceback', '')}")
        return r

    def reference(self, problem, shape, cases, hb, gate: str = "shared", baseline: bool = True) -> list[dict]:
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
                    self._ref_do(sb, hb, "stage", self.timeouts["reference"], cases=absent(missing))
            with self._with_ref(lock, gate):
                # read again with the child's lock held: another caller (the warm-up, an early verification)
                # may have computed these cases while this one waited for it, and each case is computed once
                missing = absent(missing)
                if missing:
                    r = self._ref_do(sb, hb, "reference", self.timeouts["reference"], cases=missing,
                                     baseline=baseline)
                    with self._ref_meta_lock:
                        for c, res in zip(missing, r["cases"]):
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
        peak = sum(int(sb.call("mem", 60).get("peak") or 0) for sb in children if sb is not None and sb.alive())
        sizes = [_nbytes(h) for j in jobs for h in (j.get("out"), j.get("other")) if h]
        staged = max((b + 8 * n for b, n in sizes), default=0)
        self.mem.learn((problem.name, _mem_shape(shape), stage), peak + staged)

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

    def _download(self, sb: Sandbox, cmd: str, stage: str, hb) -> dict:
        """A candidate child's kept outputs (`export` after verification, `export_timed` after timing):
        downloaded under the gate's shared side, then written to its files without it."""
        with _phase("export"), self._shared():
            ex = sb.call(cmd, self.timeouts["verify"], hb)
        self._check_reply(ex, stage, sb)
        with _phase("export-write"):  # the late-write check and the files: host work, no gate
            wr = sb.call("write_exports", self.timeouts["verify"], hb)
        self._check_reply(wr, stage, sb)
        return {**ex, "changed": ex.get("changed", []) + wr.get("changed", [])}

    def _cuda_init(self, sb: Sandbox, hb: Heartbeat = None) -> None:
        """A candidate child's CUDA context, made under the gate's shared side (once per child); then
        Triton's per-process keys, host work, outside the gate."""
        with self._shared():
            r = sb.call("cuda_init", self.timeouts["load"], hb)
        self._check_reply(r, "sandbox", sb)
        self._check_reply(sb.call("warm_triton", self.timeouts["load"], hb), "sandbox", sb)

    def _load(self, sb: Sandbox, source: str, problem, shape, hb) -> dict:
        from gpu_worker.sandbox import triton_cache_dir

        if self.cuda:
            self._cuda_init(sb, hb)  # a spare has both already: then these are two round trips
            if self.mem and self.mem.total is None:
                self.mem.learn(None, 0, sb.call("mem", 60).get("total"))
        r = sb.call("load", self.timeouts["load"], hb, source=source, problem=problem.name, shape=shape.name,
                    write_roots=[], trusted_roots=[str(triton_cache_dir())])
        self._check_reply(r, "compile", sb)
        return r

    def _loaded_child(self, key, source: str, problem, shape, hb) -> tuple[Sandbox, dict]:
        """The child the previous stage left with this candidate loaded, else a fresh one loaded now.
        Returns it with the load reply ({} when handed on: loading happened in the earlier stage)."""
        sb = self.loaded.take(key)
        if sb is not None:
            _add_phase("handed-on", 1)
            return sb, {}
        sb = self.pool.acquire()
        try:
            with _phase("load"):
                return sb, self._load(sb, source, problem, shape, hb)
        except BaseException:
            sb.close()
            raise

    def _retried_alone(self, attempt: Callable):
        """A stage that ran out of device memory, or whose child was killed by a SIGKILL the harness did not
        send (most likely the host's OOM killer), is run once more with the device to itself
        (DeviceMemory.alone): beside up to 24 other candidates the memory may have been taken by the
        neighbours, and an innocent candidate must not be scored for it (on the H200 that was 9 of 49 prefill
        evaluations in one run). What fails alone is the candidate's.
        The report says both: the retry's log starts with the first attempt's reason."""
        first = attempt()
        why = (getattr(first, "reason", "") or getattr(first, "error", "") or "") if not first.ok else ""
        if not (self.mem and (why.startswith("oom:") or (why.startswith("crash:") and "SIGKILL" in why))):
            return first
        _add_phase("retried-alone", 1)
        with self.mem.alone():
            rep = attempt()
        extra = {"seconds": (first.seconds or 0) + (rep.seconds or 0)} if hasattr(rep, "seconds") else {}
        if hasattr(rep, "gpu_seconds"):
            extra["gpu_seconds"] = (first.gpu_seconds or 0) + (rep.gpu_seconds or 0)
        note = f"first attempt beside other candidates: {why[:300]}; retried with the device to itself\n"
        extra["log_key"] = self._log(note + (self.store.get_text(rep.log_key) if rep.log_key else ""))
        return rep.model_copy(update=extra)

    @staticmethod
    def _check_reply(r: dict, stage: str, sb: Sandbox):
        if r.get("violations"):
            rule, detail = r["violations"][0]
            raise Rejection("rules", f"{rule}: {detail} (run-time guard)", sb.log_tail())
        if not r.get("ok"):
            kind = r.get("kind", "exception")
            st = {"cuda-error": "sandbox", "oom": "sandbox", "contract": "rules"}.get(kind, stage)
            raise Rejection(st, f"{kind}: {r.get('error', '')}", (r.get("traceback") or "") + "\n" + sb.log_tail())

    def _rules(self, source: str, problem: str):
        if not self.static_rules:
            return
        rep = check_source(source, problem)
        if not rep.ok:
            raise Rejection("rules", f"{rep.rule}: {rep.detail}")

    # --- compile ---------------------------------------------------------------------------------
    def compile(self, req: EvalRequest, hb: Heartbeat = None) -> CompileReport:
        return self._retried_alone(lambda: self._compile_once(req, hb))

    def _compile_once(self, req: EvalRequest, hb: Heartbeat = None) -> CompileReport:
        _waiting_heartbeat(hb)
        t0 = time.monotonic()
        source = self._source(req.source_key)
        try:
            problem = self._problem(req.problem)
            shape = self._shape(problem, req.shape)
            self._rules(source, req.problem)
            sb = self.pool.acquire()
            kept = False
            try:
                with _phase("load"):
                    self._load(sb, source, problem, shape, hb)
                with self._hold(problem, shape, "compile"):
                    r = self._compile_in(sb, problem, hb, "compile")
                    self._learn(problem, shape, "compile", [sb])
                for k, v in (r.get("timing") or {}).items():
                    _add_phase(f"compile.{k}", v)
                kernels = r["kernels"]
                over = shared_over_limit(kernels, r.get("max_shared"))
                if over:
                    raise Rejection("compile", over, sb.log_tail())
                with _phase("sass"):
                    sass = scan_sass(kernels)
                log = sb.log_tail()
                self.loaded.put(self._child_key(req.problem, shape, req.source_key), sb)
                kept = True
            finally:
                if not kept:
                    sb.close()
        except Rejection as rej:
            return CompileReport(ok=False, error=rej.reason[:4000], interpreter=self.interpreter,
                                 log_key=self._log(rej.reason + "\n" + rej.log), seconds=time.monotonic() - t0)
        except SandboxFailure as f:
            return CompileReport(ok=False, error=f"{f.kind}: {f.reason}", interpreter=self.interpreter,
                                 log_key=self._log(f.log), seconds=time.monotonic() - t0)

        def mx(key):
            vals = [k[key] for k in kernels if k.get(key) is not None]
            return max(vals) if vals else None

        tc = tma = None
        if self.cuda and kernels:
            tc = any(k.get("ptx_mma") for k in kernels) or sass.get("hgmma", False)
            tma = any(k.get("ptx_tma") for k in kernels) or sass.get("tma", False)
        lines = [f"{k.get('name')}: regs={k.get('registers')} spills={k.get('spills')} shared={k.get('shared')} "
                 f"warps={k.get('num_warps')} stages={k.get('num_stages')} wgmma={k.get('ptx_wgmma')} "
                 f"tma={k.get('ptx_tma')}" for k in kernels]
        if sass.get("text"):
            lines.append(sass["text"])
        return CompileReport(
            ok=True, registers=mx("registers"), spills=mx("spills"), shared_bytes=mx("shared"),
            num_warps=mx("num_warps"), num_stages=mx("num_stages"), tensor_cores=tc, tma=tma,
            kernels=sorted({k["name"] for k in kernels if k.get("name")}), interpreter=self.interpreter,
            log_key=self._log("\n".join(lines) + "\n" + log), seconds=time.monotonic() - t0)

    def _stage(self, sb: Sandbox, cases: list, stage: str, hb) -> None:
        """The cases' inputs into the child's host memory (bank reads, or generation): before the gate."""
        with _phase("stage"):
            self._check_reply(sb.call("stage", self.timeouts["load"], hb, cases=cases), stage, sb)

    # --- verify ----------------------------------------------------------------------------------
    def verify(self, req: EvalRequest, hb: Heartbeat = None) -> VerifyReport:
        return self._retried_alone(lambda: self._verify_once(req, hb))

    def _verify_once(self, req: EvalRequest, hb: Heartbeat = None) -> VerifyReport:
        _waiting_heartbeat(hb)
        t0 = time.monotonic()
        source = self._source(req.source_key)
        try:
            problem = self._problem(req.problem)
            shape = self._shape(problem, req.shape)
            self._rules(source, req.problem)
            res = self._verify(source, problem, shape, req.candidate_id, hb, req.source_key)
            probe, drawn = self._verify_random_shape(source, problem, shape, req, hb, res) if req.random_shape \
                else ("", None)
            return VerifyReport(ok=True, rel_err=res["rel_err"], baseline_rel_err=res["baseline_err"],
                                threshold=res["threshold"], interpreter=self.interpreter,
                                log_key=self._log(res["log"] + "\n" + probe), seconds=time.monotonic() - t0,
                                other_shapes=other_shapes(problem, shape) if self.cuda else [], random_shape=drawn)
        except Rejection as rej:
            return VerifyReport(ok=False, stage=rej.stage, reason=rej.reason[:4000], interpreter=self.interpreter,
                                rel_err=getattr(rej, "rel_err", None), threshold=getattr(rej, "threshold", None),
                                log_key=self._log(rej.reason + "\n" + rej.log), seconds=time.monotonic() - t0)
        except SandboxFailure as f:
            return VerifyReport(ok=False, stage="sandbox", reason=f"{f.kind}: {f.reason}", interpreter=self.interpreter,
                                log_key=self._log(f"{f.kind}: {f.reason}\n{f.log}"), seconds=time.monotonic() - t0)

    def _verify_random_shape(self, source, problem, verified, req: EvalRequest, hb, res: dict) -> tuple:
        """For a request with `random_shape` (a would-be best; `marathon verify`): the candidate verified
        once more, at a shape drawn from the problem's random space with the worker's secret generator, on
        inputs from secret seeds, one case per distribution: a kernel written for the listed shapes alone
        fails (`shape-specific`). The threshold is RANDOM_SLACK times the
        verified shape's, as the baseline is not run there (its first call at every new size would compile
        and autotune). Returns (the line for the log, the shape's name or None)."""
        shape = problem.random_shape(self._secret, cpu=self.interpreter)
        if shape is None:
            return "random shape: none (the problem has no random space)", None
        cases = [(d, self._secret.randrange(1 << 20, 1 << 40)) for d in problem.distributions]
        # each distribution's threshold, doubled: base_err such that max(floor, alpha * base_err) is that
        base_err = {d: RANDOM_SLACK * max(t, problem.tolerance_floor) / problem.tolerance_alpha
                    for d, t in res["thresholds"].items()}
        with self._refs_lock:  # two verifications may draw the same shape: its reference child serves both
            self._random_users[(problem.name, shape.name)] += 1
        with _phase("random-shape"):
            try:
                self._ref(problem, shape, hb)  # a new reference child: its context under the gate (_ref)
                r = self._verify(source, problem, shape, req.candidate_id, hb, req.source_key, cases=cases,
                                 base_err=base_err, hand_on=False)
            except Rejection as rej:
                # only a wrong answer there is the shape's; a guard's refusal, or the device's memory taken by
                # the neighbours (retried alone), keeps its own reason
                if rej.stage != "verify" or not rej.reason.startswith(SHAPE_WRONG):
                    raise
                wrapped = Rejection(rej.stage, f"shape-specific: correct at {verified.name}, not at {shape.name}: "
                                    f"{rej.reason}", rej.log)
                wrapped.rel_err, wrapped.threshold = getattr(rej, "rel_err", None), getattr(rej, "threshold", None)
                raise wrapped from None
            finally:
                self._forget_shape(problem, shape, cases)
        return (f"random shape {shape.name}: worst rel_err {r['rel_err']:.3e} (threshold {r['threshold']:.3e})",
                shape.name)

    def _forget_shape(self, problem, shape, cases: list) -> None:
        """A random shape's records of `cases`, dropped once its verification is over, and its reference
        child once no other verification uses it."""
        key = (problem.name, shape.name)
        with self._refs_lock:
            self._random_users[key] -= 1
            entry = self._refs.pop(key, None) if self._random_users[key] <= 0 else None
            if self._random_users[key] <= 0:
                del self._random_users[key]
        if entry is not None:
            entry[0].close()
        with self._ref_meta_lock:
            for d, seed in cases:
                self._ref_meta.pop((problem.name, shape.name, d, seed), None)

    def _compile_in(self, sb: Sandbox, problem, hb, stage: str) -> dict:
        """Compile the loaded candidate at the child's shape: one case uploaded under the gate's shared side
        (the one device step of compiling), Triton's warmup path outside it, so that a timing request's
        drain never waits for a compiler (under the interpreter: one run). Returns the compile reply."""
        dist = problem.distributions[0]
        self._stage(sb, [[dist, 0]], stage, hb)
        with _phase("prepare"), self._shared():
            pre = sb.call("prepare", self.timeouts["load"], hb, cases=[[dist, 0]], kernels=False)
        self._check_reply(pre, stage, sb)
        for k, v in (pre.get("timing") or {}).items():
            _add_phase(f"prepare.{k}", v)
        with _phase("compile"):
            r = sb.call("compile", self.timeouts["compile"], hb, dist=dist)
        self._check_reply(r, stage, sb)
        return r

    def _verify(self, source, problem, shape, candidate_id, hb, source_key: str, cases: list | None = None,
                base_err: dict | None = None, hand_on: bool = True) -> dict:
        """Verification at `shape` on `cases` (default: the candidate's seeds from the pool, every
        distribution). `base_err`: per distribution, the baseline error the thresholds are taken from,
        instead of the baseline's own on each case (which is then not computed). `hand_on`: keep the
        passing child for the candidate's benchmark. Returns the worst errors, the smallest threshold and
        each distribution's (the smallest over its cases), and the log."""
        from gpu_worker.child import compared_outputs

        names = compared_outputs(problem, shape, self.interpreter)
        cases = cases or self.cases(problem, candidate_id)
        base_err_given = base_err
        key = self._child_key(problem.name, shape, source_key)
        sb, loaded_now = self._loaded_child(key, source, problem, shape, hb)
        handed_on = False
        mem = contextlib.ExitStack()  # device-memory admission: from the upload to the last comparison
        try:
            mem.enter_context(self._hold(problem, shape, "verify"))
            if loaded_now:  # a child loaded for this shape compiles first, outside the verification's holds
                self._compile_in(sb, problem, hb, "verify")
            self._stage(sb, [list(c) for c in cases], "verify", hb)
            with _phase("prepare"), self._shared():
                pre = sb.call("prepare", self.timeouts["load"], hb, cases=[list(c) for c in cases])
            self._check_reply(pre, "verify", sb)
            for k, v in (pre.get("timing") or {}).items():
                _add_phase(f"prepare.{k}", v)
            with _phase("reference"):  # the oracles, from the bank (computed there if missing)
                refs = self.reference(problem, shape, cases, hb, baseline=base_err is None)
            # verification is untimed device work: the shared side (it never overlaps a timing), one hold per
            # step, so that a timing request's drain waits for one case, not for all of them (child.py)
            listed = [list(c) for c in cases]
            steps = [("verify_case", {"i": i}) for i in range(len(cases))] + [("verify_rerun", {})]
            if len(cases) > 1:
                steps.append(("verify_stale", {}))
            for cmd, kw in steps:
                with self._shared(), _phase("run-cases"):
                    step = sb.call(cmd, self.timeouts["verify"], hb, cases=listed, **kw)
                self._check_reply(step, "verify", sb)
            r = sb.call("verify_reply", self.timeouts["verify"], hb)
            self._check_reply(r, "verify", sb)
            for k, v in (r.get("timing") or {}).items():
                _add_phase(f"run-cases.{k}", v)
            for (dist, seed), ref, got in zip(cases, refs, r["cases"]):
                if got["hash_before"] != ref["hash"]:
                    raise Rejection("verify", f"harness error: candidate and reference inputs differ for {dist}/seed {seed}")
                if got["mutated"]:
                    raise Rejection("verify", f"input-mutation: the candidate modified its inputs {got['mutated']} "
                                    f"({dist}, seed {seed}; compared bitwise with a copy taken before the call)")
                if not got["out_type_ok"]:
                    raise Rejection("verify", "output-type: run must write into the tensors it is given in out, in "
                                    "place; an entry of out was replaced or removed")
            # The outputs' copies go to files and then onto the reference child's device, where they are
            # compared with the oracle.
            ex = self._download(sb, "export", "verify", hb)
            if ex["changed"]:
                raise Rejection("verify", f"late-write: outputs {ex['changed']} changed after the call returned "
                                "(work still running outside the call is not timed)")
            # Every comparison runs in the reference child, where the oracle already lives on the device;
            # the candidate's outputs reach it as files in the candidate's temp dir (see child._export).
            jobs = [{"case": [dist, seed], "name": n, "out": got["outputs"][n]}
                    for (dist, seed), got in zip(cases, r["cases"]) for n in names]
            if "rerun" in r:
                jobs += [{"case": None, "name": n, "out": r["rerun"][n], "other": r["cases"][0]["outputs"][n]}
                         for n in names]
            if "stale" in r:
                jobs += [{"case": list(cases[r["stale"]["case"]]), "name": n, "out": r["stale"]["outputs"][n]}
                         for n in names]
            with _phase("compare"):  # one call: the reference child reads each output file as it compares it
                cr = self._ref_call(problem, shape, hb, "compare", self.timeouts["reference"], jobs=jobs)
            self._learn(problem, shape, "verify", [sb], jobs)
            mem.close()
            cmp = iter(cr["results"])  # in the order the jobs were listed
            for k, v in (cr.get("timing") or {}).items():
                _add_phase(f"compare.{k}", v)
            log_tail = sb.log_tail()
            worst, base_worst, lines, thresholds, by_dist = 0.0, 0.0, [], [], {}
            for (dist, seed), ref in zip(cases, refs):
                base_err = ref["baseline_err"] if base_err_given is None else base_err_given[dist]
                thr = max(problem.tolerance_floor, problem.tolerance_alpha * base_err) if math.isfinite(base_err) \
                    else problem.tolerance_floor
                thresholds.append(thr)
                by_dist[dist] = min(thr, by_dist.get(dist, thr))
                base_worst = max(base_worst, base_err)
                for name in names:
                    c = next(cmp)
                    err = c["rel_err"]
                    lines.append(f"{dist:>8} seed {seed:>3} {name}: rel_err={err:.3e} baseline={base_err:.3e} threshold={thr:.3e}")
                    if c["nonfinite"] or math.isnan(err):
                        raise Rejection("verify", f"non-finite: {c['nonfinite']} of {c['numel']} elements of {name!r} are "
                                        f"NaN/Inf ({dist}, seed {seed}); outputs are NaN-poisoned, so unwritten elements "
                                        "show as NaN", "\n".join(lines))
                    if c["constant"]:
                        raise Rejection("verify", f"degenerate: output {name!r} is constant ({dist}, seed {seed})", "\n".join(lines))
                    if err > thr:
                        rej = Rejection("verify", f"wrong: rel_err {err:.3e} > threshold {thr:.3e} on {name!r} "
                                        f"({dist}, seed {seed}; baseline's own error {base_err:.3e})", "\n".join(lines))
                        rej.rel_err, rej.threshold = err, thr
                        raise rej
                    worst = max(worst, err)
            thr_min = min(thresholds)
            if "rerun" in r:
                for name in names:
                    d = next(cmp)["rel_err"]
                    lines.append(f"determinism rerun {name}: rel_diff={d:.3e}")
                    if not (d <= 0.1 * thr_min):
                        raise Rejection("verify", f"nondeterministic: rerun on fresh buffers differs by {d:.3e} on {name!r}",
                                        "\n".join(lines))
            if "stale" in r:
                for name in names:
                    e = next(cmp)["rel_err"]
                    lines.append(f"stale-output probe {name}: rel_err={e:.3e}")
                    if not (e <= thresholds[r['stale']['case']]):
                        raise Rejection("verify", f"output-cache: with the same buffers refilled with new inputs the "
                                        f"candidate returned stale/wrong {name!r} (rel_err {e:.3e})", "\n".join(lines))
            lines.append(log_tail)
            if hand_on:  # passed: the benchmark of this candidate gets this child, kernels loaded
                self.loaded.put(key, sb)
                handed_on = True
            return {"rel_err": worst, "baseline_err": base_worst, "threshold": thr_min, "thresholds": by_dist,
                    "log": "\n".join(lines)}
        finally:
            mem.close()
            if not handed_on:
                sb.close()

    def warm(self, problem_name: str, shape_name: str | None = None, hb: Heartbeat = None) -> dict:
        """Worker start-up: measure the ceilings and compute the oracle bank for every (distribution, seed)
        of the seed pool, so that no candidate's verification pays for a first oracle."""
        _waiting_heartbeat(hb)
        t0 = time.monotonic()
        problem = self._problem(problem_name)
        shape = self._shape(problem, shape_name)
        # where the warm-up's time goes (about 130 s for KDA, most of it FLA's first call): returned
        # per part, and per case by the reference child (inputs, oracle, baseline), for the worker's log
        parts: dict[str, float] = {}
        t = time.monotonic()
        ref_sb, ref_lock, _ = self._ref(problem, shape, hb)
        parts["reference-child"] = time.monotonic() - t
        t = time.monotonic()
        self.ensure_ceilings(problem, shape, hb)
        parts["ceilings"] = time.monotonic() - t
        cases = [(d, s) for s in range(SEED_POOL) for d in problem.distributions]
        t = time.monotonic()
        for i in range(0, len(cases), 4):
            self.reference(problem, shape, cases[i:i + 4], hb, gate="exclusive")
        parts["oracles"] = time.monotonic() - t
        per_case = {}
        with self._ref_meta_lock:
            for d, s_ in cases:
                for k, v in (self._ref_meta.get((problem.name, shape.name, d, s_), {}).get("timing") or {}).items():
                    per_case[k] = per_case.get(k, 0.0) + v
        parts.update({f"oracles.{k}": v for k, v in per_case.items()})
        # the timing sets as well: generated here, they reach the input bank before any benchmark needs them
        t = time.monotonic()
        for dist in problem.distributions:
            with self._with_ref(ref_lock):
                self._ref_do(ref_sb, hb, "prepare", self.timeouts["load"], **self._timing_args(dist))
        parts["timing-sets"] = time.monotonic() - t
        return {"problem": problem_name, "shape": shape.name, "oracles": len(cases), "seconds": time.monotonic() - t0,
                "parts": {k: round(v, 1) for k, v in parts.items()}}

    # --- benchmark -------------------------------------------------------------------------------
    def ensure_ceilings(self, problem, shape, hb) -> dict | None:
        if not self.cuda:
            return None
        if self.ceilings is None:
            with self._ceilings_lock:
                if self.ceilings is None:
                    self.ceilings = self._ref_call(problem, shape, hb, "ceilings", 300, gate="exclusive")
        return self.ceilings

    def benchmark(self, req: BenchRequest, hb: Heartbeat = None) -> BenchReport:
        return self._retried_alone(lambda: self._benchmark_once(req, hb))

    def _benchmark_once(self, req: BenchRequest, hb: Heartbeat = None) -> BenchReport:
        """Candidate, baseline (and the current best, when given) timed interleaved by device time on every
        input distribution of the problem; the worst speedup decides (gpu_worker.timing)."""
        _waiting_heartbeat(hb)
        source = self._source(req.source_key)
        best_source = self._source(req.best.source_key) if req.best else None
        gpu_s = [0.0]
        try:
            problem = self._problem(req.problem)
            shape = self._shape(problem, req.shape)
            self._rules(source, req.problem)
            ref_sb, ref_lock, ref_info = self._ref(problem, shape, hb)
            ceil = self.ensure_ceilings(problem, shape, hb)
            sbs, keep = [], {}
            mem = contextlib.ExitStack()  # device-memory admission: from the uploads to the last comparison
            per_dist, timed_jobs, prof = [], [], None
            try:
                cand_key = self._child_key(req.problem, shape, req.source_key)
                cand, _ = self._loaded_child(cand_key, source, problem, shape, hb)
                sbs.append(cand)
                best = None
                if best_source:
                    # the current best's child stays loaded from one benchmark to the next (the best
                    # takes part in every one)
                    best_key = self._child_key(req.problem, shape, req.best.source_key)
                    best, _ = self._loaded_child(best_key, best_source, problem, shape, hb)
                    sbs.append(best)
                mem.enter_context(self._hold(problem, shape, "benchmark"))
                # clocks read before the timed sections: nvidia-smi, host work, the reference child's lock only
                with _phase("receipt"), ref_lock:
                    receipt = self._ref_do(ref_sb, hb, "receipt", 60)
                fresh = None
                if req.fresh_process and self.cuda:
                    fresh = self.pool.acquire()
                    sbs.append(fresh)
                    ld = self._load(fresh, source, problem, shape, hb)
                for dist in problem.distributions:
                    res = self._time_distribution(problem, shape, dist, cand, ref_sb, ref_lock, best, hb, gpu_s)
                    fig = distribution_figures(dist, res["cand"], res["base"], res["best"] or None,
                                               res["cand_host"], res["base_host"])
                    fig["mode"], fig["blocks"], fig["planned_blocks"] = res["mode"], res["blocks"], res["planned_blocks"]
                    fig["captures"] = res["captures"]
                    with _phase("timed-outputs"):
                        prints = self._check_fingerprints(problem, shape, dist, res)
                        kept, jobs = self._check_timed_outputs(problem, shape, dist, cand, hb, res["noise_seed"])
                        fig["timed_outputs"] = f"{kept}; {prints}"
                    timed_jobs += jobs
                    per_dist.append(fig)
                    if shown_slower(fig):  # a clear loser: the other distributions are not timed
                        break
                verdict = decide(per_dist)
                if fresh is not None:
                    with _phase("crosscheck"):
                        prof = self._crosscheck(problem, verdict["worst"], fresh, ref_sb, ref_lock,
                                                ld.get("kernels", []), hb, gpu_s)
                self._learn(problem, shape, "benchmark", [cand, best, fresh], timed_jobs)
                mem.close()
                cand_log = cand.log_tail()
                if best is not None:
                    keep[id(best)] = best_key
                if not best or verdict["vs_best_ci"] is None or verdict["vs_best_ci"][1] > 1.0:
                    keep[id(cand)] = cand_key  # it may be the best of the next benchmark
            finally:
                mem.close()
                for s in sbs:
                    if id(s) in keep and self._park(s):
                        self.loaded.put(keep[id(s)], s)
                    else:
                        s.close()
            w = verdict["worst"]
            t_ms, b_ms = w["time_ms"], w["baseline_ms"]
            modes = sorted({d["mode"] for d in per_dist})
            mode = "interpreter" if self.interpreter else ", ".join(modes)
            rec = Receipt(device=receipt.get("device", "?"), driver=receipt.get("driver", ""),
                          clocks=receipt.get("clocks", ""), torch=receipt.get("torch", ""),
                          triton=receipt.get("triton", ""), repetitions=sum(d["samples"] for d in per_dist),
                          spread="; ".join(f"{d['dist']}: IQR {d['iqr_ms'][0]:.4g}-{d['iqr_ms'][1]:.4g} ms (baseline "
                                           f"{d['baseline_iqr_ms'][0]:.4g}-{d['baseline_iqr_ms'][1]:.4g} ms)"
                                           for d in per_dist),
                          mode=mode)
            lines = [f"judge: device time ({mode}); the worst speedup over {len(per_dist)} distributions decides"]
            for d in per_dist:
                host = (f"host latency of a synchronous call {d['host_ms']:.4g} ms (baseline {d['baseline_host_ms']:.4g} ms)"
                        if d["host_ms"] is not None and d["baseline_host_ms"] is not None else "host latency not measured")
                lines.append(f"[{d['dist']}] {d['mode']}: candidate {d['time_ms']:.4g} ms, baseline {d['baseline_ms']:.4g} ms, "
                             f"{d['speedup']:.3f}x (95% CI {d['speedup_ci'][0]:.3f}-{d['speedup_ci'][1]:.3f})"
                             + (f", current best {d['best_time_ms']:.4g} ms" if d["best_time_ms"] else "")
                             + f"; {host}; timed blocks {d['blocks']} of {d['planned_blocks']}"
                             + (" (stopped early: slower than the current best)" if d["blocks"] < d["planned_blocks"] else "")
                             + f"; captures {d['captures']}; timed outputs {d['timed_outputs']}")
            skipped = [d for d in problem.distributions if d not in {f["dist"] for f in per_dist}]
            if skipped:
                lines.append(f"not timed: {', '.join(skipped)} (already shown slower than the current best)")
            lines += [f"worst {verdict['speedup']:.3f}x ({w['dist']}), geometric mean {verdict['geomean_speedup']:.3f}x",
                      f"receipt: {rec.model_dump()}"]
            if self.cuda:
                floor = problem.floor_ms(shape, 1.1 * ceil["bandwidth"], 1.1 * ceil["flops"])
                facts = DeviceFacts(device=receipt.get("device", "?"), bandwidth_tbps=ceil["bandwidth"] / 1e12,
                                    matmul_tflops=ceil["flops"] / 1e12,
                                    floor_ms=problem.floor_ms(shape, ceil["bandwidth"], ceil["flops"]))
                if floor > 0:
                    lines.append(f"physical floor {floor:.4g} ms (ceilings: {ceil['bandwidth'] / 1e12:.2f} TB/s, "
                                 f"{ceil['flops'] / 1e12:.0f} TFLOP/s, +10% headroom)")
                else:
                    lines.append("physical floor: skipped (the problem names no FLOP or byte counts)")
                fastest = min(d["time_ms"] for d in per_dist)
                if fastest < floor:
                    raise Rejection("benchmark", f"impossible: {fastest:.4g} ms is below the physical floor {floor:.4g} ms "
                                    f"(min bytes / measured bandwidth, FLOPs / measured matmul rate)", "\n".join(lines))
            else:
                facts = None
                lines.append("physical floor: not checked (no GPU; interpreter timings say nothing about speed)")
            if prof is not None:
                lines.append(f"profiler cross-check: {prof['text']}")
                if not prof["ok"]:
                    why = "library-kernel: " if prof["foreign"] else ""  # a kernel not its own Triton did work
                    raise Rejection("benchmark", f"{why}profiler cross-check failed: {prof['text']}", "\n".join(lines))
            elif req.fresh_process:
                lines.append("profiler cross-check: skipped under the interpreter (no device kernels)")
            lines.append(cand_log)
            dists = [DistributionTiming(dist=d["dist"], time_ms=d["time_ms"], baseline_ms=d["baseline_ms"],
                                        speedup=d["speedup"], speedup_ci=d["speedup_ci"], best_time_ms=d["best_time_ms"],
                                        vs_best_ci=d["vs_best_ci"], host_ms=d["host_ms"],
                                        baseline_host_ms=d["baseline_host_ms"], mode=d["mode"], samples=d["samples"])
                     for d in per_dist]
            vs_best = verdict["vs_best_ci"]
            return BenchReport(ok=True, time_ms=t_ms, baseline_ms=b_ms, baseline_name=ref_info.get("baseline", ""),
                               speedup=verdict["speedup"], speedup_ci=verdict["speedup_ci"],
                               best_time_ms=w["best_time_ms"], vs_best_ci=vs_best,
                               vs_best=req.best.candidate_id if vs_best else None,
                               interpreter=self.interpreter, receipt=rec, log_key=self._log("\n".join(lines)),
                               gpu_seconds=gpu_s[0] if self.cuda else 0.0, distributions=dists,
                               deciding_dist=w["dist"], geomean_speedup=verdict["geomean_speedup"],
                               host_ms=w["host_ms"], baseline_host_ms=w["baseline_host_ms"],
                               kernel_ms=prof["kernel_ms"] if prof else None, device_facts=facts)
        except Rejection as rej:
            return BenchReport(ok=False, stage=rej.stage, reason=rej.reason[:4000], interpreter=self.interpreter,
                               log_key=self._log(rej.reason + "\n" + rej.log), gpu_seconds=gpu_s[0])
        except SandboxFailure as f:
            return BenchReport(ok=False, stage="sandbox", reason=f"{f.kind}: {f.reason}", interpreter=self.interpreter,
                               log_key=self._log(f"{f.kind}: {f.reason}\n{f.log}"), gpu_seconds=gpu_s[0])

    @staticmethod
    def _park(sb: Sandbox) -> bool:
        """A child about to wait for a later benchmark drops its timing sets (child.cmd_park); False if it
        cannot (then it is closed, not kept)."""
        try:
            return sb.alive() and bool(sb.call("park", 60).get("ok"))
        except SandboxFailure:
            return False

    def _plan(self):
        if self.cuda:
            return {"blocks": int(os.environ.get("MARATHON_BENCH_BLOCKS", "5")),
                    "reps": int(os.environ.get("MARATHON_BENCH_REPS", "20")), "warmup": 3, "rotate": 2, "pool": 3,
                    "host_reps": 5}
        # Interpreter: a cold first baseline call (thread pools, caches) would otherwise inflate the
        # baseline's figures; two warm-up calls cost ~0.2 s per evaluation.
        return {"blocks": 2, "reps": 3, "warmup": 2, "rotate": 2, "pool": 2, "host_reps": 1}

    def _timing_args(self, dist: str) -> dict:
        """What every side's `prepare` gets for one distribution's timing set: the same seeds, so that the
        reference child holds the values each timed repetition of a candidate ran on."""
        plan = self._plan()
        return {"rotate": plan["rotate"], "pool": plan["pool"], "dist": dist, "seed": self.timing_seed}

    def _time_distribution(self, problem, shape, dist: str, cand, ref, ref_lock, best, hb, gpu_s: list) -> dict:
        """One distribution: every side prepares its timing set (the gate's shared side), then under the
        exclusive side each side tries to capture, the mode is chosen for all of them, and candidate,
        baseline (and best) are timed in interleaved blocks; then each side's host latency."""
        plan = self._plan()
        prep = self._timing_args(dist)
        sides = [(who, sb) for who, sb in (("cand", cand), ("best", best)) if sb is not None]
        for _, sb in sides:  # one shared hold each: a timing request waits for the shorter one
            with _phase("prepare"), self._shared():
                pre = sb.call("prepare", self.timeouts["load"], hb, **prep)
            self._check_reply(pre, "benchmark", sb)
            for k, v in (pre.get("timing") or {}).items():
                _add_phase(f"prepare.{k}", v)
        with self._with_ref(ref_lock):
            self._ref_do(ref, hb, "prepare", self.timeouts["load"], **prep)
        timed_children = [cand, ref, best]
        with self._with_ref(ref_lock, "exclusive"):
            g0 = time.monotonic()
            self.sched.pin(timed_children, timed=True)  # the timed processes get cores of their own
            try:
                with _phase("interleave"):
                    return self._interleave(problem, dist, cand, ref, best, plan, hb)
            finally:
                self.sched.pin(timed_children, timed=False)
                gpu_s[0] += time.monotonic() - g0

    def _interleave(self, problem, dist: str, cand, ref, best, plan: dict, hb) -> dict:
        """A/B(/C) blocks in one mode for all sides: candidate, baseline, (current best), repeated."""
        parties = [("cand", cand), ("base", ref), ("best", best)]
        captures = {}
        # Every repetition of every side runs on values of its own: an entry, handed out once per
        # benchmark and side, perturbs a pool set with draws seeded from this secret seed (timing_inputs).
        # The baseline's timed repetitions take the candidate's entries: the same values, compared call by call.
        noise_seed, counter = int.from_bytes(os.urandom(6), "little"), [0]

        def take(n: int) -> int:
            counter[0] += n
            return counter[0] - n

        if self.cuda:
            for who, sb in parties:
                if sb is None:
                    continue
                if who == "base":  # the trusted child: its failure is the harness's (_ref_do)
                    r = self._ref_do(sb, hb, "capture", self.timeouts["time"], dist=dist)
                else:
                    r = sb.call("capture", self.timeouts["time"], hb, dist=dist)
                    self._check_reply(r, "benchmark", sb)
                captures[who] = r["captured"]
                if not r["captured"]:
                    _add_phase(f"no-capture.{who}", 1)
            mode = choose_mode(list(captures.values()))
            # Slow baselines (mla_prefill's ~30 ms) get fewer repetitions per block: about
            # MARATHON_BENCH_BLOCK_MS of baseline time per block, never fewer than 5 (25 samples a side) ...
            probe = self._ref_do(ref, hb, "time", self.timeouts["time"], reps=3, warmup=1, mode=mode, dist=dist,
                                 noise_seed=noise_seed, first=take(4))
            base_ms = median(probe["times"])
            budget_ms = float(os.environ.get("MARATHON_BENCH_BLOCK_MS", "100"))
            plan = {**plan, "reps": max(5, min(plan["reps"], int(budget_ms / max(base_ms, 1e-6))))}
            # ... and fewer blocks, never fewer than 3: about MARATHON_BENCH_TOTAL_MS of baseline time a
            # distribution
            total_ms = float(os.environ.get("MARATHON_BENCH_TOTAL_MS", "500"))
            plan["blocks"] = max(3, min(plan["blocks"], int(total_ms / (plan["reps"] * max(base_ms, 1e-6)))))
        else:
            mode = "back-to-back"  # the interpreter stand-in: the same steps, timed by perf_counter
        out = {"cand": [], "base": [], "best": [], "cand_host": [], "base_host": [], "blocks": 0,
               "planned_blocks": plan["blocks"], "captures": captures,
               "mode": mode if self.cuda else "interpreter", "checks": [], "base_checks": [], "check_names": [],
               "check_seed": int.from_bytes(os.urandom(6), "little"),  # secret: drawn per benchmark
               "noise_seed": noise_seed}
        for b in range(plan["blocks"]):
            if not another_block(b, out["best"], out["cand"]):  # a clear loser stops after its first block
                break
            warm = plan["warmup"] if b == 0 else 1
            cand_block: list = []
            for who, sb in parties:
                if sb is None:
                    continue
                # the side's fastest timed work so far bounds the device's time per repetition from below
                kw = dict(reps=plan["reps"], warmup=warm, mode=mode, keep_one=(who == "cand"), dist=dist,
                          device_floor_ms=min(out[who]) if out[who] else 0.0, noise_seed=noise_seed)
                if who == "base":
                    if cand_block:  # the baseline runs on the candidate's block's entries, fingerprinted alike
                        kw.update(first=take(warm), entries=[c[0] for c in cand_block], check_seed=out["check_seed"])
                    else:
                        kw["first"] = take(warm + plan["reps"])
                    r = self._ref_do(sb, hb, "time", self.timeouts["time"], **kw)
                    out["base_checks"] += r.get("checks") or []
                    out["check_names"] = r.get("check_names") or out["check_names"]  # the trusted side's
                else:
                    kw["first"] = take(warm + plan["reps"])
                    if who == "cand":
                        kw["check_seed"] = out["check_seed"]
                    r = sb.call("time", self.timeouts["time"], hb, **kw)
                    self._check_reply(r, "benchmark", sb)
                    if who == "cand":
                        cand_block = r.get("checks") or []
                        given = range(kw["first"] + warm, kw["first"] + warm + plan["reps"])
                        _check_entries(cand_block, len(r["times"]), list(given))
                        out["checks"] += cand_block
                out[who] += r["times"]
            out["blocks"] = b + 1
        for who, sb in parties[:2]:
            kw = dict(reps=plan["host_reps"], dist=dist, noise_seed=noise_seed, first=take(plan["host_reps"]))
            if who == "base":
                r = self._ref_do(sb, hb, "host_latency", self.timeouts["time"], **kw)
            else:
                r = sb.call("host_latency", self.timeouts["time"], hb, **kw)
                self._check_reply(r, "benchmark", sb)
            out[who + "_host"] = r["walls"]
        _add_phase("timed-blocks", out["blocks"])
        return out

    def _check_timed_outputs(self, problem, shape, dist: str, cand: Sandbox, hb, noise_seed: int) -> tuple[str, list]:
        """The outputs of timed calls (one per block, picked at random by the candidate's child, every
        timed call NaN-poisoned, its inputs values of its own) against the baseline's outputs on the
        values that call ran on: a candidate that skips or cheapens its work while being timed, or
        replays a result fixed at capture or cached from an earlier call, is rejected here, within
        `_timed_output_bound`."""
        from gpu_worker.child import compared_outputs

        names = set(compared_outputs(problem, shape, self.interpreter))
        ex = self._download(cand, "export_timed", "benchmark", hb)
        jobs = [j for j in ex["jobs"] if j["name"] in names]
        if not jobs:
            raise Rejection("benchmark", "timed-output: no output of a timed call was kept (harness error)")
        bound = self._timed_output_bound(problem, shape)
        cr = self._ref_call(problem, shape, hb, "compare_timed", self.timeouts["reference"], jobs=jobs, dist=dist,
                            noise_seed=noise_seed)
        worst = 0.0
        for job, c in zip(jobs, cr["results"]):
            err = c["rel_err"]
            if c["nonfinite"] or not math.isfinite(err) or err > bound:
                raise Rejection("benchmark", f"timed-output: the output {job['name']!r} of a timed call ({dist}, "
                                f"entry {job['set']}) is {'non-finite' if c['nonfinite'] or not math.isfinite(err) else f'off by rel-RMS {err:.3e}'}"
                                f" against the baseline's on the same inputs (bound {bound:.3e}): work skipped, "
                                "cheapened, cached or fixed at capture while being timed")
            worst = max(worst, err)
        return f"{len(jobs)} outputs, worst rel-RMS {worst:.3e} vs bound {bound:.3e}", jobs

    def _timed_output_bound(self, problem, shape) -> float:
        """rel-RMS a timed call's output may be off the baseline's on the same inputs: the verification
        threshold plus the baseline's own error, doubled (candidate and baseline each sit within their error
        of the oracle; the timing values are other inputs than the verification cases)."""
        with self._ref_meta_lock:
            errs = [m["baseline_err"] for k, m in self._ref_meta.items()
                    if k[:2] == (problem.name, shape.name) and math.isfinite(m["baseline_err"])]
        base_err = max(errs) if errs else problem.tolerance_floor
        return 2 * (max(problem.tolerance_floor, problem.tolerance_alpha * base_err) + base_err)

    def _check_fingerprints(self, problem, shape, dist: str, res: dict) -> str:
        """Every timed call of the candidate, not only the kept ones: its outputs' projections onto random
        vectors (drawn from a seed secret to the candidate until its timing began) against the baseline's,
        timed in the same block on the same pool entries and projected onto the same vectors. For an
        output off by e, the projection is off by a normal variable of standard deviation |e|; an honest
        output has |e| <= bound |baseline|, so a gap over FINGERPRINT_SIGMAS times that is a call whose
        work was skipped, or whose result is stale or cached per buffer (an honest output's gap is at most
        half a bound: 12 standard deviations short)."""
        checks, base = res.get("checks") or [], res.get("base_checks") or []
        if not checks:
            raise Rejection("benchmark", "timed-output: no fingerprint of a timed call came back (harness error)")
        if len(base) != len(checks) or any(int(c[0]) != int(b[0]) for c, b in zip(checks, base)):
            raise Rejection("benchmark", f"timed-output: the baseline's {len(base)} fingerprinted calls do not pair "
                            f"with the candidate's {len(checks)} (harness error)")
        names = res.get("check_names") or []
        bound = self._timed_output_bound(problem, shape)
        worst = 0.0
        for n, ((entry, fps), (_, fbs, norms)) in enumerate(zip(checks, base)):
            if not len(fbs) == len(norms) == len(names):
                raise Rejection("benchmark", f"timed-output: the baseline's call {n + 1} has {len(fbs)} fingerprints "
                                f"for the outputs {names} (harness error)")
            if len(fps) != len(names):
                raise Rejection("benchmark", f"timed-output: timed call {n + 1} of {len(checks)} reported {len(fps)} "
                                f"fingerprints for the outputs {names}: its report was altered")
            for name, fc, fb, norm in zip(names, fps, fbs, norms):
                gap = abs(fc - fb) / max(bound * norm, 1e-30) if math.isfinite(fc) else math.inf
                if gap > FINGERPRINT_SIGMAS:
                    raise Rejection("benchmark", f"timed-output: timed call {n + 1} of {len(checks)} ({dist}, "
                                    f"entry {entry}): the output {name!r} does not match the baseline's on the same "
                                    f"inputs ({'non-finite' if not math.isfinite(fc) else f'projection off by {gap:.3g} bounds'}): "
                                    "work skipped, cheapened, cached or fixed at capture while being timed")
                worst = max(worst, gap)
        return f"{len(checks)} timed calls fingerprinted, worst {worst:.3g} of {FINGERPRINT_SIGMAS} bounds"

    def _crosscheck(self, problem, worst: dict, fresh: Sandbox, ref, ref_lock, names: list, hb, gpu_s: list) -> dict:
        """For a new best, on the deciding distribution: profiler (CUPTI) kernel time per call agrees with
        the judged device time, for both sides (the candidate in a fresh process, the baseline in the
        reference child); the candidate's kernels appear in the trace and no other kernel launched by its work."""
        dist = worst["dist"]
        prep = self._timing_args(dist)
        with self._shared():
            pre = fresh.call("prepare", self.timeouts["load"], hb, **prep)
        self._check_reply(pre, "benchmark", fresh)
        with self._with_ref(ref_lock):
            self._ref_do(ref, hb, "prepare", self.timeouts["load"], **prep)
        with self._with_ref(ref_lock, "exclusive"):
            g0 = time.monotonic()
            try:
                # values of their own for both (a profile takes 2 + 2 x reps entries): drawn by each child
                p = fresh.call("profile", self.timeouts["profile"], hb, reps=10, dist=dist)
                self._check_reply(p, "benchmark", fresh)
                pb = self._ref_do(ref, hb, "profile", self.timeouts["profile"], reps=10, dist=dist)
            finally:
                gpu_s[0] += time.monotonic() - g0
        seen = [k for k in p["kernels"] if k in names]
        foreign = foreign_kernels(p["kernels"], names)
        ok_c, allowed_c = crosscheck(worst["time_ms"], p["kernel_ms_per_call"], p.get("launches_per_call", 1.0))
        ok_b, allowed_b = crosscheck(worst["baseline_ms"], pb["kernel_ms_per_call"], pb.get("launches_per_call", 1.0))
        ok = bool(seen) and not foreign and ok_c and ok_b
        text = (f"[{dist}] candidate judged {worst['time_ms']:.4g} ms vs profiler kernel time {p['kernel_ms_per_call']:.4g} ms/call "
                f"in a fresh process (allowed gap {allowed_c:.3g} ms, {p.get('launches_per_call', 0):.3g} launches per call); "
                f"baseline judged {worst['baseline_ms']:.4g} ms vs {pb['kernel_ms_per_call']:.4g} ms/call (allowed gap "
                f"{allowed_b:.3g} ms); candidate kernels in trace: {seen or 'NONE'}; kernels not the candidate's Triton: "
                f"{foreign or 'none'}")
        return {"ok": ok, "text": text, "foreign": foreign, "kernel_ms": p["kernel_ms_per_call"],
                "baseline_kernel_ms": pb["kernel_ms_per_call"]}

    # --- profile ---------------------------------------------------------------------------------
    def profile(self, req: EvalRequest, hb: Heartbeat = None) -> ProfileReport:
        _waiting_heartbeat(hb)
        from gpu_worker.profile import profile_candidate

        return profile_candidate(self, req, hb)

    # --- self-test -------------------------------------------------------------------------------
    def selftest(self, hb: Heartbeat = None) -> dict:
        from gpu_worker.canaries import run_canaries

        self.selftest_result = run_canaries(self, hb)
        return self.selftest_result


def _nbytes(handle: dict) -> tuple[int, int]:
    """(bytes, elements) of an exported output's handle ({path, dtype, shape})."""
    import torch

    n = math.prod(handle["shape"])
    return n * getattr(torch, handle["dtype"]).itemsize, n
