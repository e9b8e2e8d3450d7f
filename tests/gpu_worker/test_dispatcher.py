"""The dispatcher (gpu_worker.device.dispatcher): typed device items, timing blocks of several candidates batched
into one window, untimed jobs admitted only where they end before it, neither side starved, memory
declared and bounded, a stage that ran out of memory retried alone; with stand-ins for the device (threads
that hold their turn for a while, tests/gpu_worker/owner_record.py)."""

from __future__ import annotations

import threading
import time

import pytest

from gpu_worker.device.dispatcher import DeviceDispatcher, Durations, TimingBlock, UntimedJob, window_due
from gpu_worker.phases import waiting_heartbeat
from tests.gpu_worker.owner_record import Record, start


def _job(d, rec, name, hold, expected=None, mem=0.0, kind="job"):
    with d.run(UntimedJob(kind, expected, mem)):
        rec.inside("job", name, hold)


def _block(d, rec, name, hold):
    with d.run(TimingBlock()):
        rec.inside("timing", name, hold)


def test_a_window_is_due_with_a_batch_waiting_or_the_oldest_waited_long_enough():
    assert window_due([], 2, 1.0) is None
    assert window_due([10.0], 2, 1.0) == 11.0
    assert window_due([10.0, 10.5], 2, 1.0) == 10.0
    assert window_due([10.0, 10.5], 3, 0.25) == 10.25


def test_a_kinds_expected_duration_is_learned():
    d = Durations(prior=0.5)
    assert d.expect("verify") == 0.5
    for _ in range(30):
        d.observe("verify", 0.2)
    assert 0.2 <= d.expect("verify") < 0.21 and d.expect("other") == 0.5
    for s in (0.1, 0.3) * 20:
        d.observe("spread", s)
    assert 0.3 <= d.expect("spread") < 0.45  # above most of what it saw


def test_blocks_of_several_candidates_share_one_window():
    d, rec = DeviceDispatcher(max_jobs=2, batch=2, max_wait_s=5.0), Record()
    x = start(_block, d, rec, "x", 0.1)
    time.sleep(0.2)
    assert not rec.log  # one block waits for its batch
    y = start(_block, d, rec, "y", 0.1)
    x.join(5)
    y.join(5)
    assert rec.order() == ["x", "y"] and d.windows == 1 and d.blocks == 2 and not rec.bad


def test_a_lone_block_waits_at_most_max_wait():
    d, rec = DeviceDispatcher(batch=3, max_wait_s=0.3), Record()
    t0 = time.monotonic()
    _block(d, rec, "x", 0.01)
    assert 0.28 <= rec.at("x+") - t0 < 0.8


def test_jobs_go_before_a_window_only_where_they_end_before_it():
    d, rec = DeviceDispatcher(max_jobs=4, batch=2, max_wait_s=1.0), Record()
    t0 = time.monotonic()
    x = start(_block, d, rec, "x", 0.1)  # due at t0 + 1.0
    time.sleep(0.1)
    short = start(_job, d, rec, "short", 0.2, 0.2)
    long = start(_job, d, rec, "long", 0.1, 2.0)  # expected past the window: after it
    learned = start(_job, d, rec, "learned", 0.1, None)  # the prior, 0.5 s: fits
    for t in (x, short, long, learned):
        t.join(10)
    assert not rec.bad
    assert rec.at("short+") - t0 < 0.5 and rec.at("learned+") - t0 < 0.5
    assert rec.at("x+") >= max(rec.at("short-"), rec.at("learned-"))
    assert rec.at("long+") >= rec.at("x-")
    assert 0.95 <= rec.at("x+") - t0 < 1.6  # the window came when due, not later


def test_a_block_is_not_starved_by_a_stream_of_jobs():
    d, rec = DeviceDispatcher(max_jobs=3, batch=4, max_wait_s=0.3), Record()
    stop = threading.Event()

    def stream(i):
        n = 0
        while not stop.is_set():
            _job(d, rec, f"s{i}.{n}", 0.05, 0.05)
            n += 1

    streams = [start(stream, i) for i in range(4)]
    time.sleep(0.2)
    t0 = time.monotonic()
    _block(d, rec, "x", 0.05)
    waited = rec.at("x+") - t0
    stop.set()
    for t in streams:
        t.join(5)
    assert not rec.bad and 0.28 <= waited < 0.8, waited


def test_a_long_job_is_not_starved_by_a_stream_of_blocks():
    """Blocks always waiting make every window due at once, and a 5 s job never ends before one: it is
    owed a turn when the window it waited through closes."""
    d, rec = DeviceDispatcher(max_jobs=2, batch=1, max_wait_s=0.0, window_s=0.2), Record()
    stop = threading.Event()

    def stream(i):
        n = 0
        while not stop.is_set():
            _block(d, rec, f"b{i}.{n}", 0.03)
            n += 1

    streams = [start(stream, i) for i in range(2)]
    time.sleep(0.2)
    t0 = time.monotonic()
    _job(d, rec, "long", 0.05, 5.0)
    waited = rec.at("long+") - t0
    time.sleep(0.2)
    stop.set()
    for t in streams:
        t.join(5)
    assert not rec.bad and waited < 1.0, waited
    assert sum(1 for n in rec.order() if n.startswith("b")) > 10  # the blocks went on meanwhile


def test_jobs_fit_the_declared_memory():
    d, rec = DeviceDispatcher(max_jobs=4, mem_gb=1.0), Record()
    seen, mu = [], threading.Lock()

    def job(name, mem):
        with d.run(UntimedJob("j", 0.1, mem)):
            with mu:
                seen.append(sum(m for _, m in d.turns.running.values()))
            rec.inside("job", name, 0.1)

    threads = [start(job, f"a{i}", 0.6) for i in range(3)] + [start(job, "small", 0.3)]
    for t in threads:
        t.join(10)
    assert max(seen) <= 1.0 and rec.most_jobs == 2  # 0.6 beside 0.3, never two of 0.6


def test_a_cancelled_wait_leaves_nothing_taken():
    d, rec = DeviceDispatcher(max_jobs=1, batch=5, max_wait_s=30.0), Record()
    beats = []

    def waiting_block():
        def hb():
            beats.append(1)
            raise RuntimeError("cancelled")

        waiting_heartbeat(hb)
        try:
            with d.run(TimingBlock()):
                pass
        finally:
            waiting_heartbeat(None)

    with pytest.raises(RuntimeError, match="cancelled"):
        waiting_block()
    assert not d.turns.blocks_waiting and d.turns.window_since is None and beats
    _job(d, rec, "after", 0.01, 60.0)  # no window is due: any job goes
    with pytest.raises(ValueError):
        d.run(TimingBlock(), also=threading.Lock())


def test_a_stage_that_ran_out_of_memory_is_retried_alone():
    d = DeviceDispatcher()
    order, mu = [], threading.Lock()

    def note(x):
        with mu:
            order.append(x)

    first = d.stage()
    first.__enter__()

    def retry():
        with d.alone(on_start=lambda: note("shed")), d.stage():
            note("alone")

    t = start(retry)
    time.sleep(0.2)
    late = start(lambda: (d.stage().__enter__(), note("late")))
    time.sleep(0.2)
    assert order == []
    first.__exit__(None, None, None)
    t.join(5)
    late.join(5)
    assert order == ["shed", "alone", "late"]


def test_the_reference_lock_is_never_held_while_waiting_for_a_turn():
    d, rec = DeviceDispatcher(max_jobs=1, batch=1, max_wait_s=0.0), Record()
    lock = threading.Lock()
    first = d.run(UntimedJob("j", 0.1))
    first.__enter__()  # the only slot is taken
    got = threading.Event()

    def with_lock():
        with d.run(UntimedJob("j", 0.1), also=lock):
            got.set()

    t = start(with_lock)
    time.sleep(0.3)
    assert not got.is_set() and lock.acquire(timeout=1)  # it waits without the lock
    lock.release()
    first.__exit__(None, None, None)
    t.join(5)
    assert got.is_set() and not lock.locked()


def test_a_job_is_of_the_kind_its_step_names_and_the_worker_can_choose_the_dispatcher():
    from gpu_worker.phases import phase
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.settings import GpuWorkerSettings

    d = DeviceDispatcher()
    with phase("export"), d.job():
        time.sleep(0.05)
    with d.job():
        pass
    assert set(d.durations._mean) == {"export", "job"} and d.durations._mean["export"] >= 0.05
    s = Scheduler.under(GpuWorkerSettings.from_env({"MARATHON_DEVICE_POLICY": "Dispatcher",
                                                    "MARATHON_TIMING_BATCH": "3", "MARATHON_DEVICE_JOBS": "6"}),
                        spares=0)
    assert isinstance(s.owner, DeviceDispatcher) and (s.owner.batch, s.owner.max_jobs) == (3, 6)
    assert not isinstance(Scheduler.under(GpuWorkerSettings(), spares=0).owner, DeviceDispatcher)


def test_jobs_that_fit_go_first_come_first_served():
    """One slot, jobs asking in turn while it is taken: they start in the order they asked, the owed ones
    after a window too; a job too long for the time left before a window lets a short later one by."""
    d, rec = DeviceDispatcher(max_jobs=1, batch=1, max_wait_s=0.0, window_s=0.0), Record()
    first = d.run(UntimedJob("j", 0.01))
    first.__enter__()
    threads = []
    for i in range(5):
        threads.append(start(_job, d, rec, f"j{i}", 0.02, 0.01))
        time.sleep(0.05)
    block = start(_block, d, rec, "x", 0.05)  # due at once: the waiting jobs wait through it, owed
    time.sleep(0.05)
    first.__exit__(None, None, None)
    for t in threads + [block]:
        t.join(10)
    assert rec.order() == ["x", "j0", "j1", "j2", "j3", "j4"] and not rec.bad
    d, rec = DeviceDispatcher(max_jobs=1, batch=2, max_wait_s=0.5), Record()
    x = start(_block, d, rec, "x", 0.01)
    time.sleep(0.05)
    first = d.run(UntimedJob("j", 0.01))
    first.__enter__()
    long = start(_job, d, rec, "long", 0.01, 3.0)
    time.sleep(0.05)
    short = start(_job, d, rec, "short", 0.01, 0.05)
    time.sleep(0.05)
    first.__exit__(None, None, None)
    for t in (x, long, short):
        t.join(10)
    assert rec.order() == ["short", "x", "long"]
