"""The one owner of a GPU worker's device: it alone decides when this worker's work goes on the device.

Three kinds of work, and what each holds:

* a timing block (`timing()`: the interleaved benchmark, the profiler's cross-check, profiling, the
  ceilings) runs with nothing else of ours on the device, one block at a time;
* an untimed device job (`job()`: an upload, a download, kernel loading, a new child's CUDA context, a
  verification call, a comparison with the oracle) runs between timing blocks, at most `max_jobs` at once;
* host work (spawning and loading children, imports, Triton compilation, the input bank, files) holds
  nothing: it is never inside a turn, so a timing block never waits for it.

Turns are taken and held on the calling thread, so an activity's heartbeats (`beat()` while it waits) and
its phase log stay on that activity's thread. The decisions themselves are OwnerTurns'
(gpu_worker.device.turns), given the time, which the schedule's simulator drives too (gpu_worker.device.schedule_sim).

Fairness: every request takes a ticket when it first asks. A job may start only while no timing block
with an earlier ticket waits; a timing block starts once no job with an earlier ticket waits and none
runs. So a stream of jobs cannot starve a timing block (jobs that asked after it wait for it), and a
stream of timing blocks cannot starve a job (blocks that asked after it wait for it). Among jobs, a lower
rank (its activity's task priority: the run's front, a crowned candidate's checks) goes first, unless a
block that asked before it holds it back.

Timing windows: draining the device of jobs costs the rest of their turns, so once a timing block has it
drained, the blocks waiting (and those arriving meanwhile) run back to back, oldest first, before jobs
come back: one drain for several blocks. Invariant: a window takes a next block ahead of a job that asked
before that block only while the window is younger than `window_s`; past that, blocks keep running in it
only while no job that asked before them waits. So a job waits at most for one window's `window_s` (and the
block under way then) plus the blocks that asked before it.

Stages (`stage()`: a candidate's compile, verify or benchmark, from its first upload to its last
comparison) are counted, not turns: they hold no device turn. A stage retried after running out of
memory (`alone()` on its thread) waits until no other stage of ours runs (or, with `retry_beside` N, at
most N), and no other stage starts beside it until it ends (beyond N); stages arriving while it waits wait
for it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable

from gpu_worker.device.turns import DEFAULT_RANK, OwnerTurns, StageTurns, Stretches, TimingBlock, UntimedJob
from gpu_worker.phases import add_phase, beat, current_phase, current_rank
from gpu_worker.settings import GpuWorkerSettings
from workflows.metrics import add_gpu_busy, add_gpu_closed, add_gpu_timed

#: how long a waiter sleeps between looks: its heartbeat's period while it waits
WAIT_S = 2.0
DEVICE_JOBS = GpuWorkerSettings.model_fields["device_jobs"].default
TIMING_WINDOW_S = GpuWorkerSettings.model_fields["timing_window_s"].default


class ThreadedTurns:
    """Device turns taken and held on the calling threads, as decided by `turns` (gpu_worker.device.turns:
    OwnerTurns or DispatchTurns) under one lock with the monotonic clock. Counters: `busy_s` (any turn
    held), `timed_s` (timing blocks), `closed_s` (new jobs shut out), `blocks`, `windows` (drains of the
    jobs), so `blocks / windows` is how many blocks shared a drain."""

    retries_alone = True  # a stage that ran out of memory beside others is run again alone (see alone)

    def __init__(self, turns, beside: int = 0):
        """`beside`: the settings' retry_beside (StageTurns)."""
        self.turns = turns
        self.stages = StageGate(beside)  # stages and the retry alone: counted apart from the turns
        self._cv = threading.Condition()

    busy_s = property(lambda self: self.turns.stretches.busy_s)
    closed_s = property(lambda self: self.turns.stretches.closed_s)
    timed_s = property(lambda self: self.turns.timed_s)
    blocks = property(lambda self: self.turns.blocks)
    windows = property(lambda self: self.turns.windows)
    max_jobs = property(lambda self: self.turns.max_jobs)
    window_s = property(lambda self: self.turns.window_s)

    # --- under _cv -------------------------------------------------------------------------------------
    def _may(self, decide, *args) -> bool:
        """A decision of the turns', now; a change the look itself made (a window closed or opened) wakes
        every waiter, so that none misses it."""
        seen = self.turns.changes
        ok = decide(*args, time.monotonic())
        if self.turns.changes != seen:
            self._cv.notify_all()
        return ok

    def _wait(self) -> None:
        """Until something changes, or until the turns say to look again (a window due): waits re-look at
        the clock."""
        wake = self.turns.wake_at(time.monotonic())
        self._cv.wait(WAIT_S if wake is None else min(WAIT_S, max(0.001, wake - time.monotonic())))
        beat()

    # --- the one entry ---------------------------------------------------------------------------------
    def run(self, item: UntimedJob | TimingBlock, also: threading.Lock | None = None):
        """The turn `item` is: an untimed job's (with `also`, a reference child's lock, taken with the turn
        and never held while waiting for it) or a timing block's."""
        if isinstance(item, TimingBlock):
            if also is not None:
                raise ValueError("a timing block takes no lock of a child's: it waits for nothing but the device")
            return self._timing()
        return self._job(item, also)

    def job(self, also: threading.Lock | None = None, kind: str | None = None, expected_s: float | None = None,
            mem_gb: float = 0.0):
        """An untimed device job's turn, of the kind named by the caller's current step (phases.phase) where
        it names none, ranked by its activity's task priority (phases.set_rank). With `also` (a reference
        child's lock): that lock and the turn together, neither waited for while holding the other: the lock
        is taken first and given back while the turn must wait. So a timing block never waits for the
        (serial) reference child's queue, and the reference child's queue never waits for a timing block."""
        return self.run(UntimedJob(kind or current_phase() or "job", expected_s, mem_gb,
                                   current_rank() or DEFAULT_RANK), also)

    def timing(self):
        """A timing block's turn: nothing else of ours on the device until it ends."""
        return self.run(TimingBlock())

    @contextlib.contextmanager
    def _job(self, job: UntimedJob, also: threading.Lock | None):
        t0 = time.monotonic()
        also_wait, ticket, have_also, started = 0.0, None, False, False
        try:  # a cancellation arrives as an exception anywhere (the heartbeat raises): nothing stays taken
            while True:
                if also is not None:
                    ta = time.monotonic()
                    have_also = also.acquire()
                    also_wait += time.monotonic() - ta
                with self._cv:
                    if ticket is None:
                        ticket = self.turns.ticket()
                    if not self._may(self.turns.job_may_start, ticket, job) and also is None:
                        self._await_job(ticket, job)  # nothing else held: wait here
                    if also is None or self._may(self.turns.job_may_start, ticket, job):
                        self.turns.start_job(ticket, job, time.monotonic())
                        started = True
                        self._cv.notify_all()  # the next window's due time may have moved
                        break
                have_also = also.release()  # given back (release returns None): one statement, no gap
                with self._cv:
                    self._await_job(ticket, job)  # then the lock again, and a new look
        except BaseException:
            with self._cv:
                self.turns.cancel_job(ticket, started, time.monotonic())
                self._cv.notify_all()
            if have_also:
                also.release()
            raise
        t = time.monotonic()
        try:
            add_phase("gpu-job-wait", t - t0 - also_wait)
            add_phase("gpu-jobs", 1)
            if also is not None:
                add_phase("ref-wait", also_wait)  # the reference child serves one call at a time
            yield self
        finally:
            held = time.monotonic() - t
            add_phase("gpu-job-held", held)
            with self._cv:
                self.turns.end_job(ticket, job, held, time.monotonic())
                self._cv.notify_all()
            if also is not None:
                also.release()

    def _await_job(self, ticket: int, job: UntimedJob) -> None:
        """Under _cv: wait until the job may start, counted as waiting meanwhile."""
        self.turns.wait_job(ticket, job)
        try:
            while not self._may(self.turns.job_may_start, ticket, job):
                self._wait()
        finally:
            self.turns.unwait_job(ticket)
            self._cv.notify_all()  # a timing block may have waited for this ticket

    @contextlib.contextmanager
    def _timing(self):
        t0 = time.monotonic()
        with self._cv:
            ticket = self.turns.ask_block(t0)
            self._cv.notify_all()  # a window may be due now
            try:
                while not self._may(self.turns.block_may_start, ticket):
                    self._wait()
            except BaseException:  # cancelled while waiting: jobs behind it must not wait for nobody
                self.turns.cancel_block(ticket, time.monotonic())
                self._cv.notify_all()
                raise
            drained = self.turns.start_block(ticket, time.monotonic())
        t = time.monotonic()
        add_phase("gpu-wait", t - t0)
        add_phase("gpu-blocks", 1)
        if drained:
            add_phase("gpu-drains", 1)  # this block drained the device: the blocks after it in its window did not
        try:
            yield self
        finally:
            dt = time.monotonic() - t
            add_phase("gpu-held", dt)
            add_gpu_timed(dt)
            with self._cv:
                self.turns.end_block(ticket, dt, time.monotonic())
                self._cv.notify_all()

    # --- stages and the retry alone (StageGate) ------------------------------------------------------
    def alone(self, on_start: Callable[[], None] | None = None):
        return self.stages.alone(on_start)

    def stage(self):
        return self.stages.stage()


class DeviceOwner(ThreadedTurns):
    """See the module's docstring: OwnerTurns' decisions, threaded."""

    def __init__(self, max_jobs: int | None = None, window_s: float | None = None, beside: int = 0):
        """`max_jobs`: the settings' device_jobs (MARATHON_DEVICE_JOBS); `window_s`: their timing_window_s
        (MARATHON_TIMING_WINDOW_S); None takes the default; `beside`: their retry_beside."""
        super().__init__(OwnerTurns(DEVICE_JOBS if max_jobs is None else max_jobs,
                                    TIMING_WINDOW_S if window_s is None else window_s,
                                    Stretches(add_gpu_busy, add_gpu_closed)), beside)


class StageGate:
    """Stages of candidates, counted (they hold no device turn), and the retry alone of one that ran out of
    memory: see `stage` and `alone`. Apart from the turns, so that every device policy shares it."""

    def __init__(self, beside: int = 0) -> None:
        self._cv = threading.Condition()
        self.turns = StageTurns(beside)  # the decisions (gpu_worker.device.turns)
        self._local = threading.local()  # per thread: stage depth, alone

    @contextlib.contextmanager
    def alone(self, on_start: Callable[[], None] | None = None):
        """The calling thread's stages run alone (see stage): for the retry of a stage that ran out of
        device memory beside others (CandidateChildren.retried_alone). `on_start`: called once it may enter
        (no other stage runs, or no more than `beside`), before the stage itself (the worker frees its idle
        children's memory there)."""
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
            self.turns.ask(alone)
            try:
                while not self.turns.may_enter(alone):
                    self._cv.wait(WAIT_S)
                    beat()
            finally:
                self.turns.unask(alone)
                self._cv.notify_all()
            self.turns.enter(alone)
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
                self.turns.leave(alone)
                self._cv.notify_all()
