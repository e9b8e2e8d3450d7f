"""Scheduling of the GPU worker around the protocol: how many candidates share one device and its host.

The protocol (harness.Evaluator: compile, verify, benchmark) judges one candidate the same whoever calls
it; what this module adds is throughput when many evaluations run at once on one worker:

* `DeviceOwner` (gpu_worker.device.owner), the one owner of the device: timing blocks alone on it,
  untimed device jobs between them, host work outside it; or, with the settings' device_policy
  `dispatcher`, `DeviceDispatcher` (gpu_worker.device.dispatcher): the same turns, blocks batched into windows;
* `SandboxPool`, warm spare candidate children; `LoadedChildren`, a loaded child handed on from compile
  to verify to benchmark of the same candidate;
* `timing_cpus` / `pin`: cores kept for the timed processes.

`Scheduler` bundles them for `Evaluator(scheduler=...)`; the GPU worker builds one. Without it the
Evaluator runs serially (harness.serial.SerialScheduler): no device owner, no spares, no hand-on, no pinning.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable

from gpu_worker.device.owner import DeviceOwner
from gpu_worker.device.dispatcher import DeviceDispatcher
from gpu_worker.sandbox import Sandbox
from gpu_worker.settings import GpuWorkerSettings


class SandboxPool:
    """Warm spare candidate processes. `acquire()` hands out one (single use) and starts a replacement."""

    def __init__(self, interpreter: bool, spares: int = 1, ready: Callable[[Sandbox], None] | None = None,
                 cpus: set | None = None, settings: GpuWorkerSettings | None = None):
        """`ready(sb)`, if given, finishes a new spare before it is handed out (the harness creates its
        CUDA context in a device job); then spares are made in the background. `cpus`: the children's
        cores (those not kept for timed work). `settings`: handed to every child (Sandbox)."""
        self.interpreter = interpreter
        self.cpus = cpus
        self.settings = settings
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
                self._idle += [self._new() for _ in range(n)]
                return
            self._starting += n
        new = [self._new() for _ in range(n)]  # they start side by side
        # and are readied side by side, each handed out as soon as it is ready: readied one after another,
        # a burst of compiles (a population's proposals arrive together) found the pool dry while the last
        # spares waited for the first ones' contexts, and made their own
        threads = [threading.Thread(target=self._ready_one, args=(sb,), daemon=True) for sb in new]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _new(self) -> Sandbox:
        return Sandbox("candidate", self.interpreter, cpus=self.cpus, settings=self.settings)

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
            sb = self._new()
        threading.Thread(target=self.fill, daemon=True).start()
        return sb

    def shed(self) -> int:
        """Close the idle spares, freeing their memory for a stage retried alone; the next acquire starts
        the pool filling again. Returns how many were closed."""
        with self._lock:
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()
        return len(idle)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.shed()


class LoadedChildren:
    """Candidate children that already hold one candidate's module and compiled kernels, handed on from
    compile to verify to benchmark of the same candidate on this worker. Each new child paid for its
    start-up and for loading the candidate's kernels (seconds each for KDA on the H200: the phase log's
    prepare.kernels); a hand-off pays once. Isolation between candidates is unchanged: a child only ever
    holds one candidate. A stage that finds none (another worker compiled it, a retry, an eviction) loads
    a fresh child as before; children older than `ttl` seconds or beyond `limit` are closed, oldest first.

    Several children may hold the same candidate (up to `per_key`): the current best takes part in every
    benchmark, and benchmarks overlap, so each one that found the best's child taken used to load another
    and then close it (measured: 1.2 of 2 children handed on per benchmark).

    A child waits for its candidate's next stage (put by a compile or a verification) or is parked for a
    later benchmark (`parked`: the current best's, one that may become it). A compile is admitted
    (`admission`) only while the waiting children and the compiles admitted before it stay below `limit`:
    compiles on the shared queue otherwise run ahead of their candidates' later stages, and each child put
    beyond the cap closed the oldest, the next to be verified (an H100 run at 8 in flight recompiled 60 of 94
    verifications' candidates, about 10 s of a core each). A child waiting longer than `stage_wait_s` counts as
    parked (an evaluation cancelled or gone to another worker: no stage may come for it). The cap is
    `limit` and `parked_room` more for the parked; beyond it the oldest parked child is closed first."""

    def __init__(self, limit: int = 16, ttl: float = 900.0, per_key: int = 4, parked_room: int = 4,
                 admit_wait_s: float = 60.0, stage_wait_s: float = 120.0):
        self.limit, self.ttl, self.per_key, self.admit_wait_s = limit, ttl, per_key, admit_wait_s
        self.parked_room, self.stage_wait_s = parked_room, stage_wait_s
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # notified whenever a child or an admission leaves
        self._kept: list = []  # [key, Sandbox, kept at, parked], oldest first
        self._admitted = 0  # compiles admitted whose child is not yet kept

    @contextlib.contextmanager
    def admission(self, hb=None):
        """Around a compile that keeps its child: waits while the children waiting for a stage and the
        earlier admissions reach `limit`, at most `admit_wait_s` (then it goes on: a child no stage will take
        holds its room until `ttl`), heartbeating. Yields the seconds waited."""
        t0 = time.monotonic()
        with self._room:
            while self.limit > 0 and self._waiting(time.monotonic()) + self._admitted >= self.limit:
                left = self.admit_wait_s - (time.monotonic() - t0)
                if left <= 0:
                    break
                self._room.wait(min(left, 1.0))
                if hb:
                    hb()
            self._admitted += 1
        try:
            yield time.monotonic() - t0
        finally:
            with self._room:
                self._admitted -= 1
                self._room.notify_all()

    def _waiting(self, now: float) -> int:
        """With the lock held: the children waiting for their candidate's next stage."""
        return sum(not self._parked(e, now) for e in self._kept)

    def _parked(self, e, now: float) -> bool:
        return e[3] or now - e[2] > self.stage_wait_s

    def put(self, key, sb: Sandbox, parked: bool = False) -> None:
        drop = []
        with self._room:
            if self.limit > 0 and sb.alive():
                self._kept.append((key, sb, time.monotonic(), parked))
            else:
                drop.append(sb)
            drop += self._expire()
            keep = list(self._kept)
            same = [e for e in keep if e[0] == key]
            for e in same[:max(0, len(same) - self.per_key)]:  # the oldest copies of this candidate go
                keep.remove(e)
                drop.append(e[1])
            now = time.monotonic()
            while len(keep) > self.limit + self.parked_room:  # the oldest parked first: a waiting child's is next
                drop.append(keep.pop(next((i for i, e in enumerate(keep) if self._parked(e, now)), 0))[1])
            self._kept = keep
            self._room.notify_all()
        for d in drop:
            d.close()

    def take(self, key) -> Sandbox | None:
        with self._room:
            i = next((i for i in range(len(self._kept) - 1, -1, -1) if self._kept[i][0] == key), None)
            item = self._kept.pop(i) if i is not None else None
            self._room.notify_all()
        if item is None:
            return None
        _, sb, t, _ = item
        if not sb.alive() or time.monotonic() - t > self.ttl:
            sb.close()
            return None
        return sb

    def __len__(self) -> int:
        return len(self._kept)

    def sweep(self) -> int:
        """Close the children kept longer than `ttl`; returns how many. put() and take() drop them as well, but
        only when work comes: without a sweep an idle worker holds them (on CUDA, each with its context)."""
        with self._room:
            old = self._expire()
            self._room.notify_all()
        for sb in old:
            sb.close()
        return len(old)

    def _expire(self) -> list:
        """With the lock held: the children kept longer than `ttl`, taken out (the caller closes them)."""
        now = time.monotonic()
        old = [e[1] for e in self._kept if now - e[2] > self.ttl]
        self._kept = [e for e in self._kept if now - e[2] <= self.ttl]
        return old

    def sweep_every(self, period: float) -> threading.Thread:
        """sweep() every `period` seconds on a daemon thread, for as long as the process lives."""
        def loop():
            while True:
                time.sleep(period)
                self.sweep()

        t = threading.Thread(target=loop, name="loaded-children-sweep", daemon=True)
        t.start()
        return t

    def shed(self) -> int:
        """Close every kept child (their candidates load afresh at their next stage), freeing their memory
        for a stage retried alone. Returns how many were closed."""
        with self._room:
            kept, self._kept = self._kept, []
            self._room.notify_all()
        for e in kept:
            e[1].close()
        return len(kept)

    def close(self) -> None:
        self.shed()


def timing_cpus(spec: int | tuple[int, ...] | None = None) -> tuple[set, set] | None:
    """(cores kept for timed work, cores for everything else), or None when the host is too small to
    spare any. Why: a many-launch baseline (FLA's chunk_kda) may be host-bound between its launches, and
    with every core compiling candidates it timed 1.17-1.73 ms in-run against 1.2 ms on a quiet host. Own
    cores alone did not remove that spread on the H200; cache and memory
    traffic of the busy cores remain shared. `spec` (the settings' timing_cpus, MARATHON_TIMING_CPUS):
    how many (None: 2 from 8 cores up, else none), or which cores (GPU workers sharing a host each keep
    their own)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if isinstance(spec, (tuple, list)):  # explicit cores: one set per worker on a shared host
        timed = set(spec) & set(cpus)
        rest = set(cpus) - timed
        return (timed, rest) if timed and rest else None
    want = (2 if len(cpus) >= 8 else 0) if spec is None else spec
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


#: this host's split by default (no setting)
TIMING_CPUS = timing_cpus()


class Scheduler:
    """What the GPU worker hands its Evaluator: the device's owner, `spares` warm children, up to `keep`
    loaded children waiting between stages, and the timing cores (`timing_cpus`). The worker's own is
    `for_worker(settings)`."""

    def __init__(self, spares: int = 1, keep: int = 16, cpus: tuple[set, set] | None = TIMING_CPUS,
                 max_jobs: int | None = None, timing_window_s: float | None = None, owner=None, beside: int = 0):
        self.spares = spares
        self.cpus = cpus  # (cores for timed work, cores for everything else), or None
        # when this worker's work goes on the device (DeviceOwner, or a DeviceDispatcher given as `owner`)
        self.owner = owner if owner is not None else DeviceOwner(max_jobs, timing_window_s, beside)
        # a candidate's child goes on from compile to verify to benchmark (see LoadedChildren)
        self.loaded = LoadedChildren(limit=keep)

    @classmethod
    def under(cls, settings: GpuWorkerSettings, spares: int = 1, keep: int = 16) -> "Scheduler":
        """A scheduler with the timing cores and the device's policy (device_policy), jobs and windows of
        `settings`."""
        owner = None
        if settings.device_policy == "dispatcher":
            owner = DeviceDispatcher(max_jobs=settings.device_jobs, batch=settings.timing_batch,
                                     max_wait_s=settings.timing_max_wait_s, window_s=settings.timing_window_s,
                                     beside=settings.retry_beside)
        return cls(spares=spares, keep=keep, cpus=timing_cpus(settings.timing_cpus), max_jobs=settings.device_jobs,
                   timing_window_s=settings.timing_window_s, owner=owner, beside=settings.retry_beside)

    @classmethod
    def for_worker(cls, settings: GpuWorkerSettings) -> "Scheduler":
        """The GPU worker's scheduler under `settings` (resolved for its device: GpuWorkerSettings.for_device).
        Warm spares: a candidate child costs seconds to start (torch + Triton imports), and on CUDA a rolling
        population keeps several acquisitions in flight at once. Children handed from one stage to the next:
        room for every candidate in flight on this worker, twice over."""
        sched = cls.under(settings, spares=settings.spares, keep=min(32, 2 * settings.gpu_concurrency))
        # kept children expire while the worker idles too (a run ended, its queue went quiet)
        sched.loaded.sweep_every(sched.loaded.ttl / 4)
        return sched

    def pool(self, interpreter: bool, ready: Callable[[Sandbox], None] | None,
             settings: GpuWorkerSettings | None = None) -> SandboxPool:
        return SandboxPool(interpreter, spares=self.spares, ready=ready, cpus=self.cpus and self.cpus[1],
                           settings=settings)

    def spawn(self, role: str, interpreter: bool, settings: GpuWorkerSettings | None = None) -> Sandbox:
        return Sandbox(role, interpreter, cpus=self.cpus and self.cpus[1], settings=settings)

    def pin(self, children, timed: bool) -> None:
        """The timed processes onto the cores kept for them (timed=True), and back (timed=False)."""
        if self.cpus:
            pin(children, self.cpus[0] if timed else self.cpus[1])
