"""The one owner of a GPU worker's device: it alone decides when this worker's work goes on the device.

Three kinds of work, and what each holds:

* a timing block (`timing()`: the interleaved benchmark, the profiler's cross-check, profiling, the
  ceilings) runs with nothing else of ours on the device, one block at a time;
* an untimed device job (`job()`: an upload, a download, kernel loading, a new child's CUDA context, a
  verification call, a comparison with the oracle) runs between timing blocks, at most `max_jobs` at once;
* host work (spawning and loading children, imports, Triton compilation, the input bank, files) holds
  nothing: it is never inside a turn, so a timing block never waits for it.

Turns are taken and held on the calling thread, so an activity's heartbeats (`beat()` while it waits) and
its phase log stay on that activity's thread.

Fairness: every request takes a ticket when it first asks. A job may start only while no timing block
with an earlier ticket waits; a timing block starts once no job with an earlier ticket waits and none
runs. So a stream of jobs cannot starve a timing block (jobs that asked after it wait for it), and a
stream of timing blocks cannot starve a job (blocks that asked after it wait for it).

Timing windows: draining the device of jobs costs the rest of their turns, so once a timing block has it
drained, the blocks waiting (and those arriving meanwhile) run back to back, oldest first, before jobs
come back: one drain for several blocks. Invariant: a window takes a next block ahead of a job that asked
before that block only while the window is younger than `window_s`; past that, blocks keep running in it
only while no job that asked before them waits. So a job waits at most for one window's `window_s` (and the
block under way then) plus the blocks that asked before it.

Stages (`stage()`: a candidate's compile, verify or benchmark, from its first upload to its last
comparison) are counted, not turns: they hold no device turn. A stage retried after running out of
memory (`alone()` on its thread) waits until no other stage of ours runs, and no other stage starts
beside it until it ends; stages arriving while it waits wait for it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Callable

from gpu_worker.phases import add_phase, beat
from gpu_worker.settings import GpuWorkerSettings
from workflows.metrics import add_gpu_busy, add_gpu_closed, add_gpu_timed

#: how long a waiter sleeps between looks: its heartbeat's period while it waits
WAIT_S = 2.0
DEVICE_JOBS = GpuWorkerSettings.model_fields["device_jobs"].default
TIMING_WINDOW_S = GpuWorkerSettings.model_fields["timing_window_s"].default


class DeviceOwner:
    """See the module's docstring. `busy_s`: time with any turn held (the union of jobs and timing
    blocks); `timed_s`: of which timing blocks; `closed_s`: time with a timing block waiting or running
    (new jobs wait); `blocks`: timing blocks run; `windows`: timing windows opened (drains of the jobs), so
    `blocks / windows` is how many blocks shared a drain."""

    retries_alone = True  # a stage that ran out of memory beside others is run again alone (see alone)

    def __init__(self, max_jobs: int | None = None, window_s: float | None = None):
        """`max_jobs`: the settings' device_jobs (MARATHON_DEVICE_JOBS); `window_s`: their timing_window_s
        (MARATHON_TIMING_WINDOW_S); None takes the default."""
        self.max_jobs = max(1, DEVICE_JOBS if max_jobs is None else max_jobs)
        self.window_s = max(0.0, TIMING_WINDOW_S if window_s is None else window_s)
        self._cv = threading.Condition()
        self._tickets = itertools.count()
        self._jobs = 0  # untimed jobs on the device
        self._timing_on = False  # a timing block on the device
        self._timing_waiting: list[int] = []  # tickets of waiting timing blocks, oldest first
        self._jobs_waiting: set[int] = set()  # tickets of jobs waiting for the device
        self._window_since: float | None = None  # when the open timing window's first block started
        self.stages = StageGate()  # stages and the retry alone: counted apart from the turns
        self.busy_s = 0.0
        self.timed_s = 0.0
        self.closed_s = 0.0
        self.blocks = 0
        self.windows = 0
        self._busy_since: float | None = None
        self._closed_since: float | None = None

    # --- accounting (under _cv) -------------------------------------------------------------------
    def _account(self) -> None:
        """Busy and closed stretches begin and end with the state; call after every change of it."""
        now = time.monotonic()
        busy = self._timing_on or self._jobs > 0
        if busy and self._busy_since is None:
            self._busy_since = now
        elif not busy and self._busy_since is not None:
            dt, self._busy_since = now - self._busy_since, None
            self.busy_s += dt
            add_gpu_busy(dt)
        closed = self._timing_on or bool(self._timing_waiting) or self._window_since is not None
        if closed and self._closed_since is None:
            self._closed_since = now
        elif not closed and self._closed_since is not None:
            dt, self._closed_since = now - self._closed_since, None
            self.closed_s += dt
            add_gpu_closed(dt)

    def _job_may_start(self, ticket: int) -> bool:
        return (not self._timing_on and not self._window_open() and self._jobs < self.max_jobs
                and not (self._timing_waiting and self._timing_waiting[0] < ticket))

    def _timing_may_start(self, ticket: int) -> bool:
        if self._timing_on or self._jobs or self._timing_waiting[0] != ticket:
            return False
        return self._window_open() or not any(j < ticket for j in self._jobs_waiting)

    def _window_open(self) -> bool:
        """Under _cv: whether the timing window stays open (see the module's docstring: it holds while a
        block runs, or while the oldest waiting block may run next in it). Closing it lets the jobs back
        and wakes them; it is looked at by every waiter, so the window's age is never missed."""
        if self._window_since is None:
            return False
        if self._timing_on:
            return True
        if self._timing_waiting:
            first = self._timing_waiting[0]
            if (time.monotonic() - self._window_since < self.window_s
                    or not any(j < first for j in self._jobs_waiting)):
                return True
        self._window_since = None
        self._account()
        self._cv.notify_all()
        return False

    # --- untimed device jobs -------------------------------------------------------------------
    @contextlib.contextmanager
    def job(self, also: threading.Lock | None = None):
        """An untimed device job's turn. With `also` (a reference child's lock): that lock and the turn
        together, neither waited for while holding the other: the lock is taken first and given back
        while the turn must wait. So a timing block never waits for the (serial) reference child's
        queue, and the reference child's queue never waits for a timing block."""
        t0 = time.monotonic()
        also_wait = 0.0
        ticket = None
        have_also = started = False
        try:  # a cancellation arrives as an exception anywhere (the heartbeat raises): nothing stays taken
            while True:
                if also is not None:
                    ta = time.monotonic()
                    have_also = also.acquire()
                    also_wait += time.monotonic() - ta
                with self._cv:
                    if ticket is None:
                        ticket = next(self._tickets)
                    if self._job_may_start(ticket):
                        self._jobs += 1
                        started = True
                        self._account()
                        break
                    if also is None:  # nothing else held: wait here
                        self._await_job(ticket)
                        self._jobs += 1
                        started = True
                        self._account()
                        break
                have_also = also.release()  # given back (release returns None): one statement, no gap
                with self._cv:
                    self._await_job(ticket)  # then the lock again, and a new look
        except BaseException:
            if started:
                self._end_job()
            if have_also:
                also.release()
            raise
        t = time.monotonic()
        try:
            add_phase("gpu-job-wait", t - t0 - also_wait)
            if also is not None:
                add_phase("ref-wait", also_wait)  # the reference child serves one call at a time
            yield self
        finally:
            add_phase("gpu-job-held", time.monotonic() - t)
            self._end_job()
            if also is not None:
                also.release()

    def _await_job(self, ticket: int) -> None:
        """Under _cv: wait until job `ticket` may start, counted as waiting meanwhile (earlier tickets of
        timing blocks go first, later ones wait for it)."""
        self._jobs_waiting.add(ticket)
        try:
            while not self._job_may_start(ticket):
                self._cv.wait(WAIT_S)
                beat()
        finally:
            self._jobs_waiting.discard(ticket)
            self._cv.notify_all()  # a timing block may have waited for this ticket

    def _end_job(self) -> None:
        with self._cv:
            self._jobs -= 1
            self._account()
            self._cv.notify_all()

    # --- timing blocks -------------------------------------------------------------------------
    @contextlib.contextmanager
    def timing(self):
        """A timing block's turn: nothing else of ours on the device until it ends."""
        t0 = time.monotonic()
        with self._cv:
            ticket = next(self._tickets)
            self._timing_waiting.append(ticket)  # tickets rise, so the list stays oldest first
            self._account()
            try:
                while not self._timing_may_start(ticket):
                    self._cv.wait(WAIT_S)
                    beat()
            except BaseException:  # cancelled while waiting: jobs behind it must not wait for nobody
                self._timing_waiting.remove(ticket)
                self._window_open()  # a window left with no block to run closes
                self._account()
                self._cv.notify_all()
                raise
            self._timing_waiting.remove(ticket)
            self._timing_on = True
            opened = self._window_since is None
            if opened:
                self._window_since = time.monotonic()
                self.windows += 1
            self.blocks += 1
            self._account()
        t = time.monotonic()
        add_phase("gpu-wait", t - t0)
        add_phase("gpu-blocks", 1)
        if opened:
            add_phase("gpu-drains", 1)  # this block drained the device: the blocks after it in its window did not
        try:
            yield self
        finally:
            dt = time.monotonic() - t
            add_phase("gpu-held", dt)
            add_gpu_timed(dt)
            with self._cv:
                self.timed_s += dt
                self._timing_on = False
                self._window_open()  # the next waiting block runs in this window, or the jobs come back
                self._account()
                self._cv.notify_all()

    # --- stages and the retry alone (StageGate) ------------------------------------------------------
    def alone(self, on_start: Callable[[], None] | None = None):
        return self.stages.alone(on_start)

    def stage(self):
        return self.stages.stage()


class StageGate:
    """Stages of candidates, counted (they hold no device turn), and the retry alone of one that ran out of
    memory: see `stage` and `alone`. Apart from the turns, so that every device policy shares it."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._stages = 0  # stages running
        self._alone_on = False  # a stage retried alone is running
        self._alone_waiting = 0
        self._local = threading.local()  # per thread: stage depth, alone

    @contextlib.contextmanager
    def alone(self, on_start: Callable[[], None] | None = None):
        """The calling thread's stages run alone (see stage): for the retry of a stage that ran out of
        device memory beside others (Evaluator._retried_alone). `on_start`: called once no other stage
        runs, before the stage itself (the worker frees its idle children's memory there)."""
        before = getattr(self._local, "alone", False), getattr(self._local, "on_alone", None)
        self._local.alone, self._local.on_alone = True, on_start
        try:
            yield
        finally:
            self._local.alone, self._local.on_alone = before

    @contextlib.contextmanager
    def stage(self):
        """A stage of a candidate: counted while it runs; it holds no device turn. Alone (`alone()` on this
        thread): it waits until no other stage runs, and none starts beside it. A stage inside a stage of
        the same thread (a benchmark's checks verify) is part of the outer one."""
        depth = getattr(self._local, "stages", 0)
        if depth:
            self._local.stages = depth + 1
            try:
                yield
            finally:
                self._local.stages = depth
            return
        alone = getattr(self._local, "alone", False)
        t0 = time.monotonic()
        with self._cv:
            self._alone_waiting += alone
            try:
                while not (not self._alone_on and (self._stages == 0 if alone else not self._alone_waiting)):
                    self._cv.wait(WAIT_S)
                    beat()
            finally:
                self._alone_waiting -= alone
                self._cv.notify_all()
            self._stages += 1
            self._alone_on = alone
        add_phase("stage-wait", time.monotonic() - t0)
        self._local.stages = 1
        try:
            if alone:
                add_phase("stage-alone", 1)
                on_start, self._local.on_alone = getattr(self._local, "on_alone", None), None
                if on_start is not None:
                    on_start()
            yield
        finally:
            self._local.stages = 0
            with self._cv:
                self._stages -= 1
                if alone:
                    self._alone_on = False
                self._cv.notify_all()
