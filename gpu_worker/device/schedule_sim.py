"""The device's schedule, simulated: candidates' per-stage host and device costs replayed through a device
policy's own decisions (gpu_worker.device.turns: OwnerTurns or DispatchTurns, the ones the worker's threads
drive) on a simulated device, in simulated time: no threads, no sleeps, the same figures for the same seed.

What is modelled: `candidates` in flight, each going compile -> verify -> benchmark and then replaced by the
next; each stage's steps before the stage gate (loading a child), then the gate (StageTurns: with `beside`
> 0 the proposed retry that waits for memory, not for an empty device), then its steps inside; a stage's
attempt running out of memory with chance `retry_alone`, at peaks of `retry_burst` stages (the one drawn and
the next ones to end an attempt: they ran beside it at the peak), each retried alone; host work (outside
any turn) on `cores` cores, first come first served; each stage's untimed jobs and timing blocks asked for
one at a time and started as the policy decides; the reference child's lock as the harness takes it (a job:
the lock first, given back while its turn waits; a block: once on the device).
Left out: the Temporal round trips between stages, how jobs beside each other slow each other (each holds
its turn for its own length), memory beyond the jobs' declarations (when a stage runs out of it is drawn),
a retried stage's fresh children (a retry repeats its attempt's steps), and the agent that proposes
candidates (one is always ready).

Costs (gpu_worker.device.schedule_costs): the H200 KDA run's laid out as the harness asks now (or as it did then),
or a GPU worker's phase log's.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import defaultdict
from dataclasses import dataclass, field

from gpu_worker.device.turns import StageTurns, UntimedJob
from gpu_worker.device.schedule_costs import RETRY_ALONE, RETRY_BURST, STAGES, CostTable, h200_table


@dataclass
class _Ask:
    """A candidate's ask for a turn: its job (None for a block), when it first asked, its ticket once it
    has one, and how long it waited for the reference child's lock."""

    i: int
    stage: str
    kind: str
    seconds: float
    job: UntimedJob | None
    asked: float
    ticket: int | None = None
    ref_wait: float = 0.0
    lock_asked: float = 0.0


@dataclass
class Report:
    """What a simulated run gives, over its measured span (after the warm-up): evaluations an hour, shares
    of the span (device busy: any turn held; timing; shut to jobs; host cores busy), blocks per drain,
    per stage the mean seconds per activity of each wait (gpu-job-wait, gpu-wait, host-wait for a core)
    and of the whole stage, the longest waits for a job and for a block, and any broken invariant (`bad`)."""

    evaluations_per_hour: float
    busy: float
    timing: float
    shut_to_jobs: float
    host_busy: float
    blocks_per_drain: float
    waits: dict[str, dict[str, float]]
    longest_job_wait: float
    longest_block_wait: float
    fewest_evaluations: int  # by any one candidate slot: none starved
    bad: list[str] = field(default_factory=list)


class Simulation:
    """A simulated device under `turns` (an OwnerTurns or DispatchTurns), `candidates` in flight drawing
    their costs from `table`, host work on `cores` cores. `run(seconds, warmup_s)` -> Report."""

    def __init__(self, turns, table: CostTable, candidates: int = 24, cores: int = 14, seed: int = 0,
                 retry_alone: float = 0.0, retry_burst: int = 1, beside: int = 0):
        self.turns, self.table, self.cores = turns, table, max(1, cores)
        self.retry_alone, self.retry_burst = retry_alone, max(1, retry_burst)
        self._oom_left = 0  # stages beside a memory peak still to end their attempt: they ran out too
        self.stage_turns = StageTurns(beside)
        self._gate_waiting: list = []  # stages waiting at the gate: (candidate, stage, alone, asked at)
        self.rng = random.Random(seed)
        self.now = 0.0
        self._events: list = []  # (time, order, callback, args)
        self._order = 0
        self._waiting: list[_Ask] = []  # waiting for a turn, in ticket order
        self._ref_holder: _Ask | None = None  # the reference child's lock: one holder, the others in line
        self._ref_queue: list[_Ask] = []
        self._host_queue: list = []  # candidates waiting for a core: (candidate, seconds, asked at)
        self._host_busy = 0
        self._wake: float | None = None
        self._running: dict[int, _Ask] = {}  # jobs on the device, by ticket
        self._block_on = False
        self.bad: list[str] = []
        self._cands = [self._candidate(i) for i in range(candidates)]
        self._done: list[tuple[float, int]] = []
        self._stage_sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._stage_counts: dict[str, int] = defaultdict(int)
        self._longest = {"job": 0.0, "ref": 0.0, "block": 0.0}
        self._measuring = False
        self._measured_from = 0.0
        self._acc: dict[int, dict[str, float]] = {}  # per candidate: its present stage's seconds of each kind
        self._host_core_s = 0.0
        self._host_mark = 0.0

    # --- the candidates ------------------------------------------------------------------------------
    def _candidate(self, i: int):
        """A candidate slot: stages one after another, each step yielded to the simulation, which resumes
        it once the step has ended; the next candidate follows a finished benchmark."""
        while True:
            for stage in STAGES:
                t0, cost, alone = self.now, self.table.draw(stage, self.rng), False
                self._acc[i] = defaultdict(float)
                while True:
                    for what, seconds in cost.before:
                        yield stage, what, seconds, cost.mem_gb
                    yield stage, "gate", alone, 0.0
                    for what, seconds in cost.steps():
                        yield stage, what, seconds, cost.mem_gb
                    yield stage, "leave", alone, 0.0
                    if alone or not self._ran_out():
                        break
                    alone = True  # it ran out of memory beside others: again, alone
                    self._note(i, "stage-alone", 1)
                if self._measuring and t0 >= self._measured_from:  # stages begun in the measured span
                    self._acc[i]["stage"] = self.now - t0
                    for k, v in self._acc[i].items():
                        self._stage_sums[stage][k] += v
                    self._stage_counts[stage] += 1
                if stage == "benchmark":
                    self._done.append((self.now, i))

    def _ran_out(self) -> bool:
        """Whether an attempt that just ended ran out of memory: one beside a peak drawn earlier, or a new
        peak (chance retry_alone / retry_burst), which the next retry_burst - 1 attempts to end share."""
        if self._oom_left:
            self._oom_left -= 1
            return True
        if self.rng.random() < self.retry_alone / self.retry_burst:
            self._oom_left = self.retry_burst - 1
            return True
        return False

    def _note(self, i: int, what: str, seconds: float) -> None:
        """Seconds of `what` in candidate `i`'s present stage."""
        self._acc[i][what] += seconds

    def _advance(self, i: int) -> None:
        stage, kind, seconds, mem_gb = next(self._cands[i])
        if kind == "gate":
            self.stage_turns.ask(seconds)
            self._gate_waiting.append((i, stage, seconds, self.now))
            return self._settle_gate()
        if kind == "leave":
            self.stage_turns.leave(seconds)
            self._settle_gate()
            return self._advance(i)
        if kind == "host":
            if seconds <= 0:
                return self._advance(i)
            self._host_queue.append((i, stage, seconds, self.now))
            self._run_host()
            return
        ask = _Ask(i, stage, kind, seconds, None if kind == "block" else UntimedJob(stage, None, mem_gb), self.now)
        if kind == "ref":
            self._want_lock(ask)
        elif kind == "job":
            ask.ticket = self.turns.ticket()
            self.turns.wait_job(ask.ticket, ask.job)
            self._waiting.append(ask)
        else:
            ask.ticket = self.turns.ask_block(self.now)
            self._waiting.append(ask)

    def _settle_gate(self) -> None:
        """Every stage the gate lets in now, in the order they asked (StageTurns: a stage retried alone
        waits for the others to end, and none enters beside it)."""
        moved = True
        while moved:
            moved = False
            for w in self._gate_waiting:
                i, stage, alone, asked = w
                if self.stage_turns.may_enter(alone):
                    self._gate_waiting.remove(w)
                    self.stage_turns.unask(alone)
                    self.stage_turns.enter(alone)
                    self._note(i, "stage-wait", self.now - asked)
                    self._advance(i)
                    moved = True
                    break

    # --- host work on the cores ------------------------------------------------------------------------
    def _count_host(self) -> None:
        if self._measuring:
            self._host_core_s += self._host_busy * (self.now - self._host_mark)
        self._host_mark = self.now

    def _run_host(self) -> None:
        while self._host_queue and self._host_busy < self.cores:
            i, stage, seconds, asked = self._host_queue.pop(0)
            self._count_host()
            self._host_busy += 1
            self._note(i, "host-wait", self.now - asked)
            self._at(self.now + seconds, self._host_done, i)

    def _host_done(self, i: int) -> None:
        self._count_host()
        self._host_busy -= 1
        self._run_host()
        self._advance(i)

    # --- the device and the reference child's lock ----------------------------------------------------
    def _may(self, ask: "_Ask") -> bool:
        if ask.kind == "block":
            return self.turns.block_may_start(ask.ticket, self.now)
        return self.turns.job_may_start(ask.ticket, ask.job, self.now)

    def _settle(self) -> None:
        """Every waiter the policy lets go now, oldest ticket first, looking again after each (a start
        changes what the others may do): a job or block starts, a job with the reference lock goes for the
        lock (as its thread does, the turn being free). Then a look at the time the policy names."""
        moved = True
        while moved:
            moved = False
            for ask in self._waiting:
                if self._may(ask):
                    self._waiting.remove(ask)
                    if ask.kind == "ref":
                        self.turns.unwait_job(ask.ticket)
                        self._want_lock(ask)
                    else:
                        self._start(ask)
                    moved = True
                    break
        wake = self.turns.wake_at(self.now)
        if wake is not None and wake > self.now and (self._wake is None or self._wake <= self.now
                                                     or wake < self._wake):
            self._wake = wake
            self._at(wake, lambda _: None, None)  # the look itself: every event settles

    def _want_lock(self, ask: "_Ask") -> None:
        ask.lock_asked = self.now
        if self._ref_holder is None:
            self._got_lock(ask)
        else:
            self._ref_queue.append(ask)

    def _got_lock(self, ask: "_Ask") -> None:
        """The lock, then a look at the turn: taken, or the lock given back while the turn is waited for."""
        self._ref_holder = ask
        ask.ref_wait += self.now - ask.lock_asked
        if ask.ticket is None:
            ask.ticket = self.turns.ticket()
        if self._may(ask):
            self._start(ask)
            return
        self.turns.wait_job(ask.ticket, ask.job)
        bisect.insort(self._waiting, ask, key=lambda a: a.ticket)
        self._release_lock()

    def _release_lock(self) -> None:
        self._ref_holder = None
        if self._ref_queue:
            self._got_lock(self._ref_queue.pop(0))

    def _start(self, ask: "_Ask") -> None:
        waited = self.now - ask.asked - ask.ref_wait
        self._longest[ask.kind] = max(self._longest[ask.kind], waited + ask.ref_wait)
        self._note(ask.i, "gpu-wait" if ask.kind == "block" else "gpu-job-wait", waited)
        if ask.kind == "block":
            if self._running or self._block_on or self._ref_holder is not None:
                self.bad.append(f"{self.now:.3f}: a block beside {len(self._running)} jobs")
            self.turns.start_block(ask.ticket, self.now)
            self._block_on, self._ref_holder = True, ask  # the block's reference call: the lock, free then
            self._at(self.now + ask.seconds, self._block_done, ask)
            return
        self._note(ask.i, "ref-wait", ask.ref_wait)
        self._check_job(ask.job)
        self.turns.unwait_job(ask.ticket)
        self.turns.start_job(ask.ticket, ask.job, self.now)
        self._running[ask.ticket] = ask
        self._at(self.now + ask.seconds, self._job_done, ask)

    def _check_job(self, job: UntimedJob) -> None:
        n, mem = len(self._running), sum(a.job.mem_gb for a in self._running.values()) + job.mem_gb
        limit = getattr(self.turns, "mem_gb", None)
        if self._block_on or n >= self.turns.max_jobs or (limit is not None and n and mem > limit):
            self.bad.append(f"{self.now:.3f}: a job beside {n} jobs ({mem:.1f} GB), a block {self._block_on}")

    def _job_done(self, ask: "_Ask") -> None:
        del self._running[ask.ticket]
        self._note(ask.i, "gpu-job-held", ask.seconds)
        self.turns.end_job(ask.ticket, ask.job, ask.seconds, self.now)
        if ask.kind == "ref":
            self._release_lock()
        self._advance(ask.i)

    def _block_done(self, ask: "_Ask") -> None:
        self._block_on = False
        self.turns.end_block(ask.ticket, ask.seconds, self.now)
        self._release_lock()
        self._advance(ask.i)

    # --- the clock -------------------------------------------------------------------------------------
    def _at(self, t: float, fn, arg) -> None:
        self._order += 1
        heapq.heappush(self._events, (t, self._order, fn, arg))

    def run(self, seconds: float, warmup_s: float = 300.0) -> Report:
        for i in range(len(self._cands)):
            self._advance(i)
        self._settle()
        end, mark = warmup_s + seconds, None
        while self._events and self._events[0][0] <= end:
            t, _, fn, arg = heapq.heappop(self._events)
            if mark is None and t >= warmup_s:
                self.now = warmup_s
                mark = self._snapshot()
            self.now = t
            fn(arg)
            self._settle()
        self.now = end
        if mark is None:
            mark = self._snapshot()
        return self._report(mark, self._snapshot(), seconds, warmup_s)

    def _snapshot(self) -> dict:
        self._count_host()
        if not self._measuring:
            self._measuring, self._measured_from = True, self.now
        busy, closed = self.turns.stretches.totals(self.now)
        return {"busy": busy, "closed": closed, "timed": self.turns.timed_s, "blocks": self.turns.blocks,
                "windows": self.turns.windows, "host": self._host_core_s}

    def _report(self, a: dict, b: dict, span: float, warmup_s: float) -> Report:
        done = [i for t, i in self._done if t >= warmup_s]
        per_slot = [sum(1 for i in done if i == k) for k in range(len(self._cands))]
        waits = {s: {k: v / max(1, self._stage_counts[s]) for k, v in self._stage_sums[s].items()}
                 for s in STAGES}
        blocks, windows = b["blocks"] - a["blocks"], b["windows"] - a["windows"]
        return Report(evaluations_per_hour=len(done) / span * 3600, busy=(b["busy"] - a["busy"]) / span,
                      timing=(b["timed"] - a["timed"]) / span, shut_to_jobs=(b["closed"] - a["closed"]) / span,
                      host_busy=(b["host"] - a["host"]) / span / self.cores,
                      blocks_per_drain=blocks / windows if windows else 0.0, waits=waits,
                      longest_job_wait=max(self._longest["job"], self._longest["ref"]),
                      longest_block_wait=self._longest["block"],
                      fewest_evaluations=min(per_slot), bad=self.bad)


def simulate(turns, table: CostTable | None = None, candidates: int = 24, cores: int = 14, hours: float = 1.0,
             warmup_s: float = 300.0, seed: int = 0, retry_alone: float = RETRY_ALONE,
             retry_burst: int = RETRY_BURST, beside: int = 0) -> Report:
    """One simulated run of `turns` (a fresh OwnerTurns or DispatchTurns) under `table` (the H200 KDA costs
    as the harness asks for them now, by default); `beside`: the stage gate's (StageTurns)."""
    sim = Simulation(turns, table or h200_table(), candidates, cores, seed, retry_alone, retry_burst, beside)
    return sim.run(hours * 3600, warmup_s)
