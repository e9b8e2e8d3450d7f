"""The device policies' decisions as plain state machines, every decision given the time (`now`): who may
go on the device next, and the counters. The threaded turns (gpu_worker.device.owner.DeviceOwner,
gpu_worker.device.dispatcher.DeviceDispatcher) drive them under a lock with the monotonic clock; the schedule's
simulator (gpu_worker.device.schedule_sim) drives the same ones with simulated time. So each decision is made in
one place, whoever waits for it.

Both take the same calls, in this order for a job: `ticket()` when it first asks, `job_may_start`, then
`wait_job` while it waits (and `unwait_job` when it stops waiting), `start_job`, `end_job`; for a block:
`ask_block`, `block_may_start`, `start_block`, `end_block`; `cancel_job` / `cancel_block` where one is
given up (an exception, a cancelled activity). `wake_at`:
when a waiter must look again though nothing changed (None: only a change matters). `changes` counts the
changes a look itself made (a window closed or opened), after which every waiter must look again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable


#: an untimed job's rank where its stage's task came with no priority: the task queues' default key
DEFAULT_RANK = 3


@dataclass(frozen=True)
class UntimedJob:
    """Untimed device work. `expected_s`: how long it runs (None: learned for its `kind`); `mem_gb`: the
    device memory it takes beyond what its process holds already; `rank`: its stage's task priority (1 a
    crowned candidate's checks, 2 the run's oldest unrecorded iteration): a job waits while one of a lower
    rank waits that could start, as the task queue served them."""

    kind: str = "job"
    expected_s: float | None = None
    mem_gb: float = 0.0
    rank: int = DEFAULT_RANK


@dataclass(frozen=True)
class TimingBlock:
    """Timed device work: nothing else of ours on the device while it runs."""

    kind: str = "timing"


class Stretches:
    """Busy time (any turn held) and closed time (new jobs shut out) in stretches that begin and end with
    the state: `update(now, busy, closed)` after every change; `on_busy` / `on_closed` are told each
    stretch as it ends (the worker's metrics)."""

    def __init__(self, on_busy: Callable[[float], None] | None = None,
                 on_closed: Callable[[float], None] | None = None):
        self.busy_s = self.closed_s = 0.0
        self._busy_since: float | None = None
        self._closed_since: float | None = None
        self._on_busy, self._on_closed = on_busy, on_closed

    def update(self, now: float, busy: bool, closed: bool) -> None:
        if busy and self._busy_since is None:
            self._busy_since = now
        elif not busy and self._busy_since is not None:
            dt, self._busy_since = now - self._busy_since, None
            self.busy_s += dt
            if self._on_busy:
                self._on_busy(dt)
        if closed and self._closed_since is None:
            self._closed_since = now
        elif not closed and self._closed_since is not None:
            dt, self._closed_since = now - self._closed_since, None
            self.closed_s += dt
            if self._on_closed:
                self._on_closed(dt)

    def totals(self, now: float) -> tuple[float, float]:
        """(busy, closed) seconds until `now`, the stretches still open counted to `now`."""
        return (self.busy_s + (now - self._busy_since if self._busy_since is not None else 0.0),
                self.closed_s + (now - self._closed_since if self._closed_since is not None else 0.0))


class _Turns:
    """What both policies count: `blocks` (timing blocks run), `windows` (drains of the jobs), `timed_s`."""

    def __init__(self, stretches: Stretches | None):
        self.stretches = stretches or Stretches()
        self._tickets = itertools.count()
        self.blocks = self.windows = 0
        self.timed_s = 0.0
        self.changes = 0

    def ticket(self) -> int:
        return next(self._tickets)

    def wake_at(self, now: float) -> float | None:
        return None


class OwnerTurns(_Turns):
    """DeviceOwner's decisions (see gpu_worker.device.owner): a timing block drains the jobs when it asks;
    tickets in order of asking; blocks that wait run back to back in one window, ahead of jobs that asked
    before them only while the window is younger than `window_s`."""

    def __init__(self, max_jobs: int, window_s: float, stretches: Stretches | None = None):
        super().__init__(stretches)
        self.max_jobs, self.window_s = max(1, max_jobs), max(0.0, window_s)
        self.jobs = 0  # untimed jobs on the device
        self.timing_on = False
        self.timing_waiting: list[int] = []  # tickets of waiting timing blocks, oldest first
        self.jobs_waiting: dict[int, UntimedJob] = {}
        self.window_since: float | None = None  # when the open timing window's first block started

    def account(self, now: float) -> None:
        closed = self.timing_on or bool(self.timing_waiting) or self.window_since is not None
        self.stretches.update(now, self.timing_on or self.jobs > 0, closed)

    def window_open(self, now: float) -> bool:
        """Whether the timing window stays open: while a block runs, or while the oldest waiting block may
        run next in it. Closing it (a change: every waiter looks again) lets the jobs back."""
        if self.window_since is None:
            return False
        if self.timing_on:
            return True
        if self.timing_waiting:
            first = self.timing_waiting[0]
            if now - self.window_since < self.window_s or not any(j < first for j in self.jobs_waiting):
                return True
        self.window_since = None
        self.changes += 1
        self.account(now)
        return False

    def job_may_start(self, ticket: int, job: UntimedJob, now: float) -> bool:
        return (not self.timing_on and not self.window_open(now) and self.jobs < self.max_jobs
                and not self._behind_block(ticket)
                # a waiting job of a lower rank goes first, unless a block that asked before it holds it back
                and not any(j.rank < job.rank and not self._behind_block(t) for t, j in self.jobs_waiting.items()))

    def _behind_block(self, ticket: int) -> bool:
        return bool(self.timing_waiting) and self.timing_waiting[0] < ticket

    def wait_job(self, ticket: int, job: UntimedJob) -> None:
        self.jobs_waiting[ticket] = job

    def unwait_job(self, ticket: int) -> None:
        self.jobs_waiting.pop(ticket, None)

    def cancel_job(self, ticket: int, started: bool, now: float) -> None:
        self.jobs_waiting.pop(ticket, None)
        if started:
            self.jobs -= 1
        self.account(now)

    def start_job(self, ticket: int, job: UntimedJob, now: float) -> None:
        self.jobs_waiting.pop(ticket, None)
        self.jobs += 1
        self.account(now)

    def end_job(self, ticket: int, job: UntimedJob, held_s: float, now: float) -> None:
        self.jobs -= 1
        self.account(now)

    def ask_block(self, now: float) -> int:
        ticket = self.ticket()
        self.timing_waiting.append(ticket)  # tickets rise: the list stays oldest first
        self.account(now)
        return ticket

    def block_may_start(self, ticket: int, now: float) -> bool:
        if self.timing_on or self.jobs or self.timing_waiting[0] != ticket:
            return False
        return self.window_open(now) or not any(j < ticket for j in self.jobs_waiting)

    def start_block(self, ticket: int, now: float) -> bool:
        """Returns whether this block opened its window (drained the device of jobs)."""
        self.timing_waiting.remove(ticket)
        self.timing_on = True
        opened = self.window_since is None
        if opened:
            self.window_since = now
            self.windows += 1
        self.blocks += 1
        self.account(now)
        return opened

    def end_block(self, ticket: int, held_s: float, now: float) -> None:
        self.timed_s += held_s
        self.timing_on = False
        self.window_open(now)  # the next waiting block runs in this window, or the jobs come back
        self.account(now)

    def cancel_block(self, ticket: int, now: float) -> None:
        self.timing_waiting.remove(ticket)
        self.window_open(now)  # a window left with no block to run closes
        self.account(now)


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


class DispatchTurns(_Turns):
    """DeviceDispatcher's decisions (see gpu_worker.device.dispatcher): windows due by batch or by the oldest
    block's wait, jobs admitted only where expected to end before the next window, owed jobs first,
    declared memory bounded."""

    def __init__(self, max_jobs: int = 4, batch: int = 2, max_wait_s: float = 1.0, window_s: float = 4.0,
                 mem_gb: float | None = None, durations: Durations | None = None,
                 stretches: Stretches | None = None):
        super().__init__(stretches)
        self.max_jobs, self.batch = max(1, max_jobs), max(1, batch)
        self.max_wait_s, self.window_s, self.mem_gb = max(0.0, max_wait_s), max(0.0, window_s), mem_gb
        self.durations = durations or Durations()
        self.running: dict[int, tuple[float, float]] = {}  # job ticket -> (expected end, memory)
        self.jobs_waiting: dict[int, UntimedJob] = {}
        self.blocks_waiting: list[tuple[int, float]] = []  # (ticket, asked at), oldest first
        self.owed: set[int] = set()  # jobs that waited through a window: the next is not due before they start
        self.window_since: float | None = None  # a window is open (draining or timing) since then
        self.window_blocks = 0  # blocks run in the open window
        self.timing_on = False

    def account(self, now: float) -> None:
        self.stretches.update(now, self.timing_on or bool(self.running), self.window_since is not None)

    def due(self) -> float | None:
        if self.owed:
            return None  # not before every owed job has started
        return window_due([t for _, t in self.blocks_waiting], self.batch, self.max_wait_s)

    def wake_at(self, now: float) -> float | None:
        return None if self.window_since is not None else self.due()

    def _open_window_if_due(self, now: float) -> None:
        due = self.due()
        if self.window_since is None and due is not None and now >= due:
            self.window_since = now
            self.window_blocks = 0
            self.windows += 1
            self.changes += 1
            self.account(now)

    def expected(self, job: UntimedJob) -> float:
        return job.expected_s if job.expected_s is not None else self.durations.expect(job.kind)

    def job_may_start(self, ticket: int, job: UntimedJob, now: float) -> bool:
        """Admitted now, and no job of a lower rank or of its rank that asked earlier would be (first come,
        first served among the jobs of a rank that fit; a job too long for the time left before a window lets
        shorter ones by)."""
        self._open_window_if_due(now)
        if not self._fits(ticket, job, now):
            return False
        return not any((j.rank, t) < (job.rank, ticket) and self._fits(t, j, now)
                       for t, j in self.jobs_waiting.items())

    def _fits(self, ticket: int, job: UntimedJob, now: float) -> bool:
        if self.window_since is not None or self.timing_on or len(self.running) >= self.max_jobs:
            return False
        if self.owed and ticket not in self.owed:
            return False  # the jobs a window kept waiting go first, so that the next window can come
        if self.mem_gb is not None and self.running and \
                sum(m for _, m in self.running.values()) + job.mem_gb > self.mem_gb:
            return False
        if ticket in self.owed:
            return True
        due = self.due()
        return due is None or now + self.expected(job) <= due

    def wait_job(self, ticket: int, job: UntimedJob) -> None:
        self.jobs_waiting[ticket] = job

    def unwait_job(self, ticket: int) -> None:
        self.jobs_waiting.pop(ticket, None)  # still owed, if it was, until it starts

    def cancel_job(self, ticket: int, started: bool, now: float) -> None:
        self.jobs_waiting.pop(ticket, None)
        self.owed.discard(ticket)
        if started:
            self.running.pop(ticket, None)
        self.account(now)

    def start_job(self, ticket: int, job: UntimedJob, now: float) -> None:
        self.jobs_waiting.pop(ticket, None)
        self.running[ticket] = (now + self.expected(job), job.mem_gb)
        self.owed.discard(ticket)
        self.account(now)

    def end_job(self, ticket: int, job: UntimedJob, held_s: float, now: float) -> None:
        self.running.pop(ticket, None)
        self.durations.observe(job.kind, held_s)
        self.account(now)

    def ask_block(self, now: float) -> int:
        ticket = self.ticket()
        self.blocks_waiting.append((ticket, now))
        return ticket

    def block_may_start(self, ticket: int, now: float) -> bool:
        self._open_window_if_due(now)
        if self.window_since is None or self.timing_on or self.running:
            return False
        return self.blocks_waiting[0][0] == ticket

    def start_block(self, ticket: int, now: float) -> bool:
        """Returns whether this block is its window's first (the one that drained the jobs)."""
        self.blocks_waiting.pop(0)
        self.timing_on = True
        self.blocks += 1
        first, self.window_blocks = self.window_blocks == 0, self.window_blocks + 1
        self.account(now)
        return first

    def _close_window_if_done(self, now: float) -> None:
        """After a block: the window stays open for the next waiting block while young, or while no job
        waits; else it closes, and every job waiting then is owed a turn before the next."""
        if self.window_since is None or self.timing_on:
            return
        young = now - self.window_since < self.window_s
        if self.blocks_waiting and (young or not self.jobs_waiting):
            return
        self.window_since = None
        self.owed |= set(self.jobs_waiting)
        self.changes += 1
        self.account(now)

    def end_block(self, ticket: int, held_s: float, now: float) -> None:
        self.timed_s += held_s
        self.timing_on = False
        self._close_window_if_done(now)
        self.account(now)

    def cancel_block(self, ticket: int, now: float) -> None:
        self.blocks_waiting = [b for b in self.blocks_waiting if b[0] != ticket]
        self._close_window_if_done(now)


class StageTurns:
    """StageGate's decisions (see gpu_worker.device.owner): stages counted; one retried alone (after running
    out of memory beside others) enters once no other stage runs, and none enters while it runs or waits.

    `beside` > 0 (the settings' retry_beside; 0 by default): the retried stage waits for
    memory, not for an empty device: it enters once at most `beside` other stages run (the memory they hold
    and the idle children shed, it has what it lacked), none entering while it waits; while it runs, others
    enter while at most `beside` run beside it."""

    def __init__(self, beside: int = 0) -> None:
        self.beside = max(0, beside)
        self.stages = 0  # stages running
        self.alone_on = False  # a stage retried alone is running
        self.alone_waiting = 0

    def ask(self, alone: bool) -> None:
        self.alone_waiting += alone

    def unask(self, alone: bool) -> None:
        self.alone_waiting -= alone

    def may_enter(self, alone: bool) -> bool:
        if alone:
            return not self.alone_on and self.stages <= self.beside
        return not self.alone_waiting and (not self.alone_on or self.stages - 1 < self.beside)

    def enter(self, alone: bool) -> None:
        self.stages += 1
        self.alone_on = alone

    def leave(self, alone: bool) -> None:
        self.stages -= 1
        if alone:
            self.alone_on = False
