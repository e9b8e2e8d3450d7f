"""Scheduling of the GPU worker around the protocol: how many candidates share one device and its host.

The protocol (harness.Evaluator: compile, verify, benchmark) judges one candidate the same whoever calls
it; what this module adds is throughput when many evaluations run at once on one worker:

* `TimedLock`, the GPU gate: timed work alone on the device, untimed work side by side;
* `DeviceMemory`, admission by device memory, so that neighbours never run a candidate out of memory;
* `SandboxPool`, warm spare candidate children; `LoadedChildren`, a loaded child handed on from compile
  to verify to benchmark of the same candidate;
* `timing_cpus` / `pin`: cores kept for the timed processes.

`Scheduler` bundles them for `Evaluator(scheduler=...)`; the GPU worker builds one. Without it the
Evaluator runs serially (harness_serial.SerialScheduler): no gate, no admission, no spares, no hand-on, no pinning.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable

from gpu_worker.phases import add_phase, beat
from gpu_worker.sandbox import Sandbox
from workflows.metrics import add_gpu_busy, add_gpu_closed, add_gpu_timed


class SandboxPool:
    """Warm spare candidate processes. `acquire()` hands out one (single use) and starts a replacement."""

    def __init__(self, interpreter: bool, spares: int = 1, ready: Callable[[Sandbox], None] | None = None,
                 cpus: set | None = None):
        """`ready(sb)`, if given, finishes a new spare before it is handed out (the harness creates its
        CUDA context under the GPU gate); then spares are made in the background. `cpus`: the children's
        cores (those not kept for timed work)."""
        self.interpreter = interpreter
        self.cpus = cpus
        self.spares = spares
        self.ready = ready
        self._lock = threading.Lock()
        self._idle: list[Sandbox] = []
        self._starting = 0
        self._closed = False
        if ready is None:
            self.fill()
        else:
            threading.Thread(target=self.fill, daemon=True).start()

    def fill(self) -> None:
        with self._lock:
            self._idle = [s for s in self._idle if s.alive()]
            n = max(0, self.spares - len(self._idle) - self._starting) if not self._closed else 0
            if self.ready is None:
                self._idle += [Sandbox("candidate", self.interpreter, cpus=self.cpus) for _ in range(n)]
                return
            self._starting += n
        new = [Sandbox("candidate", self.interpreter, cpus=self.cpus) for _ in range(n)]  # they start side by side
        # and are readied side by side, each handed out as soon as it is ready: readied one after another,
        # a burst of compiles (a population's proposals arrive together) found the pool dry while the last
        # spares waited for the first ones' contexts, and made their own
        threads = [threading.Thread(target=self._ready_one, args=(sb,), daemon=True) for sb in new]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _ready_one(self, sb: Sandbox) -> None:
        try:
            self.ready(sb)
        except Exception:  # noqa: BLE001 - a spare that failed to start is dropped, not handed out
            sb.close()
        with self._lock:
            self._starting -= 1
            if self._closed or not sb.alive():
                sb.close()
            else:
                self._idle.append(sb)

    def acquire(self) -> Sandbox:
        with self._lock:
            sb = None
            while self._idle:
                cand = self._idle.pop(0)
                if cand.alive():
                    sb = cand
                    break
                cand.close()
        if sb is None:
            sb = Sandbox("candidate", self.interpreter, cpus=self.cpus)
        threading.Thread(target=self.fill, daemon=True).start()
        return sb

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()


class LoadedChildren:
    """Candidate children that already hold one candidate's module and compiled kernels, handed on from
    compile to verify to benchmark of the same candidate on this worker. Each new child paid for its
    start-up and for loading the candidate's kernels (seconds each for KDA on the H200: the phase log's
    prepare.kernels); a hand-off pays once. Isolation between candidates is unchanged: a child only ever
    holds one candidate. A stage that finds none (another worker compiled it, a retry, an eviction) loads
    a fresh child as before; children older than `ttl` seconds or beyond `limit` are closed, oldest first.

    Several children may hold the same candidate (up to `per_key`): the current best takes part in every
    benchmark, and benchmarks overlap, so each one that found the best's child taken used to load another
    and then close it (measured: 1.2 of 2 children handed on per benchmark)."""

    def __init__(self, limit: int = 16, ttl: float = 900.0, per_key: int = 4):
        self.limit, self.ttl, self.per_key = limit, ttl, per_key
        self._lock = threading.Lock()
        self._kept: list = []  # [key, Sandbox, kept at], oldest first

    def put(self, key, sb: Sandbox) -> None:
        drop = []
        with self._lock:
            if self.limit > 0 and sb.alive():
                self._kept.append((key, sb, time.monotonic()))
            else:
                drop.append(sb)
            now = time.monotonic()
            keep = []
            for entry in self._kept:
                if now - entry[2] > self.ttl:
                    drop.append(entry[1])
                else:
                    keep.append(entry)
            same = [e for e in keep if e[0] == key]
            for e in same[:max(0, len(same) - self.per_key)]:  # the oldest copies of this candidate go
                keep.remove(e)
                drop.append(e[1])
            while len(keep) > self.limit:
                drop.append(keep.pop(0)[1])
            self._kept = keep
        for d in drop:
            d.close()

    def take(self, key) -> Sandbox | None:
        with self._lock:
            i = next((i for i in range(len(self._kept) - 1, -1, -1) if self._kept[i][0] == key), None)
            item = self._kept.pop(i) if i is not None else None
        if item is None:
            return None
        _, sb, t = item
        if not sb.alive() or time.monotonic() - t > self.ttl:
            sb.close()
            return None
        return sb

    def __len__(self) -> int:
        return len(self._kept)

    def reserved(self) -> int:
        """Device bytes the waiting children hold (a kept best keeps its timing sets)."""
        with self._lock:
            return sum(sb.reserved for _, sb, _ in self._kept)

    def close(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, []
        for _, sb, _ in kept:
            sb.close()


def timing_cpus() -> tuple[set, set] | None:
    """(cores kept for timed work, cores for everything else), or None when the host is too small to
    spare any. Why: a many-launch baseline (FLA's chunk_kda) may be host-bound between its launches, and
    with every core compiling candidates it timed 1.17-1.73 ms in-run against 1.2 ms on a quiet host. Own
    cores alone did not remove that spread on the H200; cache and memory
    traffic of the busy cores remain shared. MARATHON_TIMING_CPUS: how many (default 2 from 8 up), or
    which ("30,31", "28-29": GPU workers sharing a host each keep their own)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    spec = os.environ.get("MARATHON_TIMING_CPUS", "2" if len(cpus) >= 8 else "0").strip()
    if "," in spec or "-" in spec:  # explicit cores, e.g. "30,31" or "28-29": one set per worker on a shared host
        timed = set()
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            timed |= set(range(int(lo), int(hi or lo) + 1))
        timed &= set(cpus)
        rest = set(cpus) - timed
        return (timed, rest) if timed and rest else None
    want = int(spec)
    if want <= 0 or want >= len(cpus):
        return None
    return set(cpus[-want:]), set(cpus[:-want])


def pin(sandboxes, cpus: set | None) -> None:
    """Move the children's main threads (where launches happen) onto `cpus`; a child gone meanwhile is
    skipped (its failure is reported by its own call)."""
    if not cpus:
        return
    for sb in sandboxes:
        if sb is not None and sb.alive():
            try:
                os.sched_setaffinity(sb.proc.pid, cpus)
            except OSError:
                pass


class TimedLock:
    """The GPU gate of one worker. Exclusive (`with lock:`): timed work (the interleaved benchmark, the
    profiler's cross-check, profiling, the ceilings), one job at a time and nothing else of this
    worker's on the device meanwhile. Shared (`with lock.shared():`): all untimed device work (uploads,
    downloads, kernel loading, a new child's CUDA context, verification runs, comparisons with the
    oracle), any number at once, never while timed work runs, because another process's device work
    inflates timings (a many-launch baseline most). Busy time is the union of both
    sides' holds.

    Exclusive has preference after `patience_s`: a timing request first waits that long for the shared
    holds to end by themselves while new shared work still starts; then the gate closes to new shared work
    until the holds have drained and every queued timing request has run (one drain for the batch). With
    no patience every request closed the gate at once, and with a timing request about every 2.5 s and
    drains of 1-3 s the gate was closed most of the time: a shared entry waited about 5 s
    while the shared holds lasted about 0.6 s.

    A holder of either side waits for nothing but the device: a timing request waits for every shared
    hold to end, and nothing else starts meanwhile. When shared holds included waits for the
    (one, serial) reference child, each drain lasted that child's queue, about 11 s per benchmark;
    taking the child's lock first made the child's queue wait for every drain instead (about 20 s
    per activity). `shared(also=lock)` takes both without holding one while waiting for the other;
    the exclusive side takes the gate first, then the child's lock (Evaluator._with_ref)."""

    def __init__(self, patience_s: float | None = None):
        self._cv = threading.Condition()
        self._exclusive = False
        self._waiting = 0
        self._closing = False  # new shared work waits: a timing request ran out of patience, or a batch runs
        self.patience_s = float(os.environ.get("MARATHON_GATE_PATIENCE_S", "2.0")) if patience_s is None \
            else patience_s
        self._shared = 0
        self.busy_s = 0.0  # time with the gate held on either side: the harness has work on the device
        self.timed_s = 0.0  # of which exclusive (timing)
        self.closed_s = 0.0  # closed to new shared work: a drain for timing, or timing (see _closed)
        self._t = 0.0
        self._busy_since: float | None = None
        self._closed_since: float | None = None

    def _enter(self) -> None:  # under _cv: the first holder starts a busy stretch
        if self._busy_since is None:
            self._busy_since = time.monotonic()

    def _leave(self) -> None:  # under _cv: the last holder ends it
        if not self._exclusive and not self._shared and self._busy_since is not None:
            dt = time.monotonic() - self._busy_since
            self._busy_since = None
            self.busy_s += dt
            add_gpu_busy(dt)  # Prometheus: marathon_gpu_busy_seconds_total, the busy fraction's numerator

    def _closed(self) -> None:  # under _cv, after any change of _exclusive or _closing
        if self._exclusive or self._closing:
            if self._closed_since is None:
                self._closed_since = time.monotonic()
        elif self._closed_since is not None:
            dt = time.monotonic() - self._closed_since
            self._closed_since = None
            self.closed_s += dt
            add_gpu_closed(dt)  # Prometheus: marathon_gpu_closed_seconds_total

    def acquire(self):
        t = time.monotonic()
        with self._cv:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    left = t + self.patience_s - time.monotonic()
                    if left <= 0:
                        self._closing = True  # no new shared work from now: the holds drain
                        self._closed()
                    self._cv.wait(min(2.0, left) if left > 0 else 2.0)
                    beat()
            except BaseException:  # cancelled while waiting: the gate must not stay closed for nobody
                self._waiting -= 1
                if not self._waiting and not self._exclusive:
                    self._closing = False
                    self._closed()
                    self._cv.notify_all()
                raise
            self._waiting -= 1
            self._exclusive = True
            self._closed()
            self._enter()
        self._t = time.monotonic()
        add_phase("gpu-wait", self._t - t)

    def release(self):
        dt = time.monotonic() - self._t
        self.timed_s += dt
        add_phase("gpu-held", dt)
        add_gpu_timed(dt)
        with self._cv:
            self._exclusive = False
            self._closing = self._waiting > 0  # the queued timing requests run next, as one batch
            self._closed()
            self._leave()
            self._cv.notify_all()

    def _try_shared(self) -> bool:
        with self._cv:
            if self._exclusive or self._closing:
                return False
            self._shared += 1
            self._enter()
            return True

    def _await_shared(self) -> None:
        with self._cv:
            while self._exclusive or self._closing:
                self._cv.wait(2.0)
                beat()

    @contextlib.contextmanager
    def shared(self, also: threading.Lock | None = None):
        """The shared side; with `also` (a reference child's lock), that lock and the shared side together,
        neither waited for while holding the other: the lock is taken first and given back whenever the
        gate is closed. So a holder of the gate never waits for the serial reference child (a timing
        request's drain would last that child's whole queue), and a holder of the child's lock never
        waits for the gate (the child's queue would last every drain)."""
        t0 = time.monotonic()
        also_wait = 0.0
        have_also = have_shared = False
        try:  # an activity's cancellation arrives as an exception anywhere: nothing taken stays taken
            while True:
                if also is not None:
                    ta = time.monotonic()
                    have_also = also.acquire()
                    also_wait += time.monotonic() - ta
                have_shared = self._try_shared()
                if have_shared:
                    break
                if also is not None:
                    have_also = also.release()  # given back (release returns None): one statement, no gap
                self._await_shared()
        except BaseException:
            if have_shared:
                self._release_shared()
            if have_also:
                also.release()
            raise
        t = time.monotonic()
        try:
            add_phase("gpu-shared-wait", t - t0 - also_wait)
            if also is not None:
                add_phase("ref-wait", also_wait)  # the reference child serves one call at a time
            yield self
        finally:
            # how long shared holds last decides how long a timing request waits for them to drain
            add_phase("gpu-shared-held", time.monotonic() - t)
            self._release_shared()
            if also is not None:
                also.release()

    def _release_shared(self) -> None:
        with self._cv:
            self._shared -= 1
            self._leave()
            if not self._shared:
                self._cv.notify_all()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False


class DeviceMemory:
    """Admission by device memory, so that many candidates at once on one GPU never run it out of memory
    (an out-of-memory caused by the neighbours would be scored against an innocent candidate). Each
    stage of a candidate (compile, verify, benchmark) holds its estimated footprint from its first upload
    to its last comparison. The estimate is learned: the largest seen for (problem, shape, stage), that is
    the children's peak reserved bytes plus what one comparison adds in the reference child; before one is
    seen, a quarter of the capacity. A stage is admitted while the held estimates plus what the device
    carries anyway (reference children, children waiting between stages, one CUDA context per child)
    stay within `fraction` of the device; one stage always runs, so nothing waits forever.

    That model adds up peaks as if every held stage were at its peak at once, and stages hold their
    estimate through their waits for the GPU gate: on the H200 it kept stages waiting 20 s (KDA) to
    130 s (prefill) with the device at most 52-76% full (nvidia-smi). So the device's own reading
    calibrates it: a stage the model refuses is admitted when the device's free memory, as a reference
    child read it in the last `fresh_s` seconds, less the estimates of the stages admitted since that
    reading (not yet visible in it) and less its own estimate, still leaves `1 - fraction` of the device
    free. That margin absorbs what stages admitted before the reading may still grow by. Waiters are
    served oldest first once the oldest has waited `grace_s` (see _turn)."""

    CONTEXT = Sandbox.CONTEXT

    def __init__(self, fraction: float, carried: Callable[[], int],
                 device_free: Callable[[], tuple[float, int] | None] = lambda: None, fresh_s: float = 5.0,
                 grace_s: float = 10.0):
        self.fraction = fraction
        self.carried = carried  # bytes the device holds outside the admitted stages, recomputed per check
        self.device_free = device_free  # (monotonic time, free bytes) of the latest trusted reading
        self.fresh_s = fresh_s
        self.total: int | None = None  # learned from the first child's reply
        self.used = 0
        self.holders = 0
        self.by_device = 0  # admissions the model refused and the device's reading allowed
        self._admitted: dict[int, tuple[float, int]] = {}  # ticket -> (when admitted, estimate)
        self._waiting: dict[int, float] = {}  # ticket -> when it began to wait, oldest first
        self._tickets = 0
        self.grace_s = grace_s
        self._est: dict = {}
        self._alone_held = 0  # stages admitted with the device to themselves (see alone)
        self._alone = threading.local()
        self._cv = threading.Condition()

    def _asks_alone(self) -> bool:
        """Whether the calling thread is inside `alone` (its stage is the retry)."""
        return getattr(self._alone, "on", False)

    @contextlib.contextmanager
    def alone(self):
        """This thread's stages are admitted only with no other stage admitted, and none is admitted beside
        them: for a retry of a stage that ran out of memory beside others (Evaluator._retried_alone)."""
        self._alone.on = True
        try:
            yield
        finally:
            self._alone.on = False

    def learn(self, key, nbytes: int, total: int | None = None) -> None:
        with self._cv:
            if total:
                self.total = total
            if nbytes > 0:
                self._est[key] = max(self._est.get(key, 0), int(nbytes))

    def estimate(self, key) -> int:
        with self._cv:
            if key in self._est:
                return self._est[key]
            return int(self.fraction * self.total / 4) if self.total else 0

    def _fits(self, n: int) -> str | None:
        """Why a stage of `n` bytes may start now ("model" or "device"), or None if it must wait."""
        if not self.holders or not self.total:
            return "model"
        if self._alone_held or self._asks_alone():
            return None
        if self.used + n + self.carried() <= self.fraction * self.total:
            return "model"
        reading = self.device_free()
        if reading is None or time.monotonic() - reading[0] > self.fresh_s:
            return None
        since = sum(est for t, est in self._admitted.values() if t >= reading[0])
        if reading[1] - since - n >= (1 - self.fraction) * self.total:
            return "device"
        return None

    def _turn(self, ticket: int, now: float) -> bool:
        """Whether waiter `ticket` may take memory now: the oldest waiter always; a younger one only while
        the oldest has waited less than `grace_s`. Without this, a stage could wait indefinitely while
        younger ones took each freed block, and the run records in iteration order: once one
        prefill verification waited the whole call and held back the records of the 46 behind it."""
        oldest = next(iter(self._waiting))
        return ticket == oldest or now - self._waiting[oldest] < self.grace_s

    @contextlib.contextmanager
    def hold(self, key):
        n = self.estimate(key)
        t = time.monotonic()
        with self._cv:
            ticket = self._tickets = self._tickets + 1
            self._waiting[ticket] = t
            try:
                while not (self._turn(ticket, time.monotonic()) and (why := self._fits(n))):
                    self._cv.wait(0.5)  # what the device carries changes without a notify: look again
                    beat()
            finally:
                del self._waiting[ticket]
                self._cv.notify_all()  # the next oldest may now be first in line
            alone = self._asks_alone()
            self.used += n
            self.holders += 1
            self._alone_held += alone
            self._admitted[ticket] = (time.monotonic(), n)
            if why == "device":
                self.by_device += 1
        add_phase("mem-wait", time.monotonic() - t)
        add_phase("mem-est-gb", n / 1e9)  # what the model charged this stage (a size, not seconds)
        reading = self.device_free()
        if reading is not None:  # the device's latest trusted reading of its free memory, and its age
            add_phase("mem-free-gb", reading[1] / 1e9)
            add_phase("mem-reading-age", time.monotonic() - reading[0])
        if why == "device":
            add_phase("mem-by-device", 1)
        if alone:
            add_phase("mem-alone", 1)
        try:
            yield n
        finally:
            with self._cv:
                self.used -= n
                self.holders -= 1
                self._alone_held -= alone
                del self._admitted[ticket]
                self._cv.notify_all()


TIMING_CPUS = timing_cpus()


class Scheduler:
    """What the GPU worker hands its Evaluator: one gate, memory admission on CUDA, `spares` warm children,
    up to `keep` loaded children waiting between stages, and the timing cores (`timing_cpus`)."""

    def __init__(self, spares: int = 1, keep: int = 16, cpus: tuple[set, set] | None = TIMING_CPUS,
                 mem_fraction: float | None = None):
        self.spares = spares
        self.cpus = cpus  # (cores for timed work, cores for everything else), or None
        self.mem_fraction = float(os.environ.get("MARATHON_GPU_MEM_FRACTION", "0.85")) if mem_fraction is None \
            else mem_fraction
        self.gate = TimedLock()  # timing, verification and profiling never share the GPU (see TimedLock)
        # a candidate's child goes on from compile to verify to benchmark (see LoadedChildren)
        self.loaded = LoadedChildren(limit=keep)

    def memory(self, carried: Callable[[], int]) -> DeviceMemory:
        """Candidates at once on one device stay within its memory (see DeviceMemory)."""
        return DeviceMemory(self.mem_fraction, carried, lambda: Sandbox.device_free)

    def pool(self, interpreter: bool, ready: Callable[[Sandbox], None] | None) -> SandboxPool:
        return SandboxPool(interpreter, spares=self.spares, ready=ready, cpus=self.cpus and self.cpus[1])

    def spawn(self, role: str, interpreter: bool) -> Sandbox:
        return Sandbox(role, interpreter, cpus=self.cpus and self.cpus[1])

    def pin(self, children, timed: bool) -> None:
        """The timed processes onto the cores kept for them (timed=True), and back (timed=False)."""
        if self.cpus:
            pin(children, self.cpus[0] if timed else self.cpus[1])
