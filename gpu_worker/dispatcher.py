"""A dispatcher that owns the device's schedule: device work is a queue of typed items, and the dispatcher,
not the caller, decides when each goes on the device.

* An `UntimedJob` (an upload, a verification call, a comparison) says what it is (`kind`) and, where it
  knows, how long it runs and how much device memory it takes; a job's expected duration is otherwise
  learned per kind from the durations seen (`Durations`).
* A `TimingBlock` runs with nothing else of ours on the device.

Timing windows batch the blocks of several candidates behind one drain of the jobs. A window is *due* once
`batch` blocks wait, or once the oldest has waited `max_wait_s`; from then on no job is admitted, the
running jobs end, and the waiting blocks run back to back, oldest first (blocks that arrive meanwhile
join while the window is younger than `window_s`, or while no job waits). Before a window is due, a job is
admitted only where it is expected to end before the window is: so a drain costs the jobs' overrun of
their expected times, not their whole length.

Neither side starves. Blocks: a due window admits no new job, and the jobs running are expected to end by
then. Jobs: every job waiting when a window closes is *owed* a turn: owed jobs start before any other, and
the next window is not due before each of them has started, whatever its expected length. Memory: with
`mem_gb`, jobs run beside each other only while their declared memory fits it (one alone always may). A
stage that runs out of memory anyway is retried alone (StageGate, as the device owner does).

Same turns as `DeviceOwner` (`job()`, `timing()`, `stage()`, `alone()`, and its counters), taken and held on
the calling thread, so heartbeats and the phase log stay there; `run(item)` is the one entry both go through.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from dataclasses import dataclass

from gpu_worker.device_owner import WAIT_S, StageGate
from gpu_worker.phases import add_phase, beat, current_phase
from workflows.metrics import add_gpu_busy, add_gpu_closed, add_gpu_timed


@dataclass(frozen=True)
class UntimedJob:
    """Untimed device work. `expected_s`: how long it runs (None: learned for its `kind`); `mem_gb`: the
    device memory it takes beyond what its process holds already."""

    kind: str = "job"
    expected_s: float | None = None
    mem_gb: float = 0.0


@dataclass(frozen=True)
class TimingBlock:
    """Timed device work: nothing else of ours on the device while it runs."""

    kind: str = "timing"


class Durations:
    """Expected seconds per kind of job, learned from those that ran: a running mean plus twice the mean
    absolute deviation (so that most jobs end by their expectation), `prior` until a kind is seen."""

    def __init__(self, prior: float = 0.5, weight: float = 0.2):
        self.prior, self.weight = prior, weight
        self._mean: dict[str, float] = {}
        self._dev: dict[str, float] = {}

    def expect(self, kind: str) -> float:
        if kind not in self._mean:
            return self.prior
        return self._mean[kind] + 2.0 * self._dev[kind]

    def observe(self, kind: str, seconds: float) -> None:
        if kind not in self._mean:
            self._mean[kind], self._dev[kind] = seconds, seconds / 2
            return
        w = self.weight
        self._dev[kind] = (1 - w) * self._dev[kind] + w * abs(seconds - self._mean[kind])
        self._mean[kind] = (1 - w) * self._mean[kind] + w * seconds


def window_due(waiting_since: list[float], batch: int, max_wait_s: float) -> float | None:
    """When the next window is due, given when each waiting block asked (oldest first): at once with
    `batch` waiting, else when the oldest has waited `max_wait_s`; None with none waiting."""
    if not waiting_since:
        return None
    if len(waiting_since) >= batch:
        return waiting_since[0]
    return waiting_since[0] + max_wait_s


class DeviceDispatcher:
    """See the module's docstring. Counters as DeviceOwner's: `busy_s`, `timed_s`, `closed_s` (time with a
    window due or open: new jobs wait), `blocks`, `windows` (drains)."""

    retries_alone = True

    def __init__(self, max_jobs: int = 4, batch: int = 2, max_wait_s: float = 1.0, window_s: float = 4.0,
                 mem_gb: float | None = None, durations: Durations | None = None):
        self.max_jobs, self.batch = max(1, max_jobs), max(1, batch)
        self.max_wait_s, self.window_s, self.mem_gb = max(0.0, max_wait_s), max(0.0, window_s), mem_gb
        self.durations = durations or Durations()
        self.stages = StageGate()
        self._cv = threading.Condition()
        self._tickets = itertools.count()
        self._running: dict[int, tuple[float, float]] = {}  # job ticket -> (expected end, memory)
        self._jobs_waiting: dict[int, UntimedJob] = {}
        self._blocks_waiting: list[tuple[int, float]] = []  # (ticket, asked at), oldest first
        self._owed: set[int] = set()  # jobs that waited through a window: the next is not due before they start
        self._window_since: float | None = None  # a window is open (draining or timing) since then
        self._window_blocks = 0  # blocks run in the open window
        self._timing_on = False
        self.busy_s = self.timed_s = self.closed_s = 0.0
        self.blocks = self.windows = 0
        self._busy_since: float | None = None
        self._closed_since: float | None = None

    # --- decisions (under _cv) ----------------------------------------------------------------------
    def _due(self) -> float | None:
        if self._owed:
            return None  # not before every owed job has started
        return window_due([t for _, t in self._blocks_waiting], self.batch, self.max_wait_s)

    def _open_window_if_due(self, now: float) -> None:
        due = self._due()
        if self._window_since is None and due is not None and now >= due:
            self._window_since = now
            self._window_blocks = 0
            self.windows += 1
            self._account()

    def _job_may_start(self, ticket: int, job: UntimedJob, now: float) -> bool:
        """Admitted now, and no job that asked earlier would be (first come, first served among the jobs
        that fit; a job too long for the time left before a window lets shorter ones by)."""
        self._open_window_if_due(now)
        if not self._fits(ticket, job, now):
            return False
        return not any(t < ticket and self._fits(t, j, now) for t, j in self._jobs_waiting.items())

    def _fits(self, ticket: int, job: UntimedJob, now: float) -> bool:
        if self._window_since is not None or self._timing_on or len(self._running) >= self.max_jobs:
            return False
        if self._owed and ticket not in self._owed:
            return False  # the jobs a window kept waiting go first, so that the next window can come
        if self.mem_gb is not None and self._running and \
                sum(m for _, m in self._running.values()) + job.mem_gb > self.mem_gb:
            return False
        if ticket in self._owed:
            return True
        due = self._due()
        expected = job.expected_s if job.expected_s is not None else self.durations.expect(job.kind)
        return due is None or now + expected <= due

    def _block_may_start(self, ticket: int, now: float) -> bool:
        self._open_window_if_due(now)
        if self._window_since is None or self._timing_on or self._running:
            return False
        return self._blocks_waiting[0][0] == ticket

    def _close_window_if_done(self, now: float) -> None:
        """After a block: the window stays open for the next waiting block while young, or while no job
        waits; else it closes, and every job waiting then is owed a turn before the next."""
        if self._window_since is None or self._timing_on:
            return
        young = now - self._window_since < self.window_s
        if self._blocks_waiting and (young or not self._jobs_waiting):
            return
        self._window_since = None
        self._owed |= set(self._jobs_waiting)
        self._account()

    def _account(self) -> None:
        now = time.monotonic()
        busy = self._timing_on or bool(self._running)
        if busy and self._busy_since is None:
            self._busy_since = now
        elif not busy and self._busy_since is not None:
            dt, self._busy_since = now - self._busy_since, None
            self.busy_s += dt
            add_gpu_busy(dt)
        closed = self._window_since is not None
        if closed and self._closed_since is None:
            self._closed_since = now
        elif not closed and self._closed_since is not None:
            dt, self._closed_since = now - self._closed_since, None
            self.closed_s += dt
            add_gpu_closed(dt)

    def _wait(self) -> None:
        """Under _cv: until something changes, or the next window may be due (waits re-look at the clock)."""
        due = None if self._window_since is not None else self._due()
        timeout = WAIT_S if due is None else min(WAIT_S, max(0.001, due - time.monotonic()))
        self._cv.wait(timeout)
        beat()

    # --- the one entry ------------------------------------------------------------------------------
    def run(self, item: UntimedJob | TimingBlock, also: threading.Lock | None = None):
        """The turn `item` is: an untimed job's (with `also`, a reference child's lock, taken with the turn
        and never held while waiting for it) or a timing block's."""
        if isinstance(item, TimingBlock):
            if also is not None:
                raise ValueError("a timing block takes no lock of a child's: it waits for nothing but the device")
            return self._timing(item)
        return self._job(item, also)

    def job(self, also: threading.Lock | None = None, kind: str | None = None, expected_s: float | None = None,
            mem_gb: float = 0.0):
        """DeviceOwner's call: an untimed job, of the kind named by the caller's current step (phases.phase)
        where it names none."""
        return self.run(UntimedJob(kind or current_phase() or "job", expected_s, mem_gb), also)

    def timing(self):
        return self.run(TimingBlock())

    def stage(self):
        return self.stages.stage()

    def alone(self, on_start=None):
        return self.stages.alone(on_start)

    @contextlib.contextmanager
    def _job(self, job: UntimedJob, also: threading.Lock | None):
        t0 = time.monotonic()
        also_wait, ticket, have_also, started = 0.0, None, False, False
        try:
            while True:
                if also is not None:
                    ta = time.monotonic()
                    have_also = also.acquire()
                    also_wait += time.monotonic() - ta
                with self._cv:
                    if ticket is None:
                        ticket = next(self._tickets)
                    if not self._job_may_start(ticket, job, time.monotonic()) and also is None:
                        self._await_job(ticket, job)
                    if also is None or self._job_may_start(ticket, job, time.monotonic()):
                        self._start_job(ticket, job)
                        started = True
                        break
                have_also = also.release()  # given back (release returns None), then wait without it
                with self._cv:
                    self._await_job(ticket, job)
        except BaseException:
            with self._cv:
                self._jobs_waiting.pop(ticket, None)
                self._owed.discard(ticket)
                if started:
                    self._running.pop(ticket, None)
                self._account()
                self._cv.notify_all()
            if have_also:
                also.release()
            raise
        t = time.monotonic()
        try:
            add_phase("gpu-job-wait", t - t0 - also_wait)
            if also is not None:
                add_phase("ref-wait", also_wait)
            yield self
        finally:
            held = time.monotonic() - t
            add_phase("gpu-job-held", held)
            with self._cv:
                self._running.pop(ticket, None)
                self.durations.observe(job.kind, held)
                self._account()
                self._cv.notify_all()
            if also is not None:
                also.release()

    def _await_job(self, ticket: int, job: UntimedJob) -> None:
        self._jobs_waiting[ticket] = job
        try:
            while not self._job_may_start(ticket, job, time.monotonic()):
                self._wait()
        finally:
            self._jobs_waiting.pop(ticket, None)
            self._cv.notify_all()

    def _start_job(self, ticket: int, job: UntimedJob) -> None:
        expected = job.expected_s if job.expected_s is not None else self.durations.expect(job.kind)
        self._running[ticket] = (time.monotonic() + expected, job.mem_gb)
        self._owed.discard(ticket)
        self._account()
        self._cv.notify_all()  # the next window's due time may have moved

    @contextlib.contextmanager
    def _timing(self, block: TimingBlock):
        t0 = time.monotonic()
        with self._cv:
            ticket = next(self._tickets)
            self._blocks_waiting.append((ticket, t0))
            self._cv.notify_all()
            try:
                while not self._block_may_start(ticket, time.monotonic()):
                    self._wait()
            except BaseException:
                self._blocks_waiting = [b for b in self._blocks_waiting if b[0] != ticket]
                self._close_window_if_done(time.monotonic())
                self._cv.notify_all()
                raise
            self._blocks_waiting.pop(0)
            self._timing_on = True
            self.blocks += 1
            first, self._window_blocks = self._window_blocks == 0, self._window_blocks + 1
            self._account()
        t = time.monotonic()
        add_phase("gpu-wait", t - t0)
        add_phase("gpu-blocks", 1)
        if first:
            add_phase("gpu-drains", 1)  # this block's window drained the jobs: those after it in the window did not
        try:
            yield self
        finally:
            dt = time.monotonic() - t
            add_phase("gpu-held", dt)
            add_gpu_timed(dt)
            with self._cv:
                self.timed_s += dt
                self._timing_on = False
                self._close_window_if_done(time.monotonic())
                self._account()
                self._cv.notify_all()
