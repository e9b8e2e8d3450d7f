"""The device owner (gpu_worker.device.owner.DeviceOwner): timing blocks alone on the device, untimed jobs
between them and bounded, neither side starved, every turn given back on every path, and a stage retried
after running out of memory alone among the stages; and the harness's use of it with the reference child's
lock (test_device_owner_harness.py)."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from gpu_worker.device.owner import DeviceOwner
from tests.gpu_worker.owner_record import Record, start


def test_jobs_side_by_side_and_bounded_timing_alone_and_accounted():
    owner, rec = DeviceOwner(max_jobs=2), Record()

    def job(i, hold):
        with owner.job():
            rec.inside("job", f"j{i}", hold)

    def timing(name, hold):
        with owner.timing():
            rec.inside("timing", name, hold)

    a, b, c = start(job, 1, 0.3), start(job, 2, 0.3), start(job, 3, 0.05)  # the third waits for a slot
    time.sleep(0.1)
    x = start(timing, "x", 0.2)  # waits for the jobs; a job asking after it waits for it
    time.sleep(0.05)
    d = start(job, 4, 0.01)
    for t in (a, b, c, x, d):
        t.join(10)
    assert not rec.bad and rec.most_jobs == 2
    assert rec.at("j3+") >= min(rec.at("j1-"), rec.at("j2-"))  # bounded: two at once
    assert rec.at("j2+") < rec.at("j1-")  # side by side
    assert rec.at("x+") >= max(rec.at("j1-"), rec.at("j2-"), rec.at("j3-"))  # j3 asked before x: it went first
    assert rec.at("j4+") >= rec.at("x-")  # j4 asked after x: it waited
    # busy: the union of the turns (0.3 s, 0.05 s, 0.2 s, 0.01 s, partly overlapping); timed: the block;
    # closed: from x's request to its end
    assert owner.timed_s >= 0.2 and owner.busy_s >= 0.5 and owner.busy_s < 0.9
    assert 0.4 <= owner.closed_s < 0.8
    assert owner.turns.jobs == 0 and not owner.turns.timing_on and not owner.turns.timing_waiting and not owner.turns.jobs_waiting


def test_a_timing_block_is_not_starved_by_a_stream_of_jobs():
    owner, rec = DeviceOwner(max_jobs=3), Record()
    stop = threading.Event()

    def stream(i):
        n = 0
        while not stop.is_set():  # each job asks again as soon as its last one ended: always one running
            with owner.job():
                rec.inside("job", f"s{i}.{n}", 0.05)
            n += 1

    streams = [start(stream, i) for i in range(4)]
    time.sleep(0.2)
    asked = time.monotonic()
    with owner.timing():
        rec.inside("timing", "x", 0.01)
    waited = time.monotonic() - asked
    stop.set()
    for t in streams:
        t.join(10)
    assert not rec.bad
    assert waited < 1.0, f"the timing block waited {waited:.2f} s behind the jobs"


def test_a_job_is_not_starved_by_a_stream_of_timing_blocks():
    # blocks run back to back after one drain for at most the window's 0.3 s while the job waits
    owner, rec = DeviceOwner(max_jobs=1, window_s=0.3), Record()
    stop = threading.Event()

    def stream(i):
        n = 0
        while not stop.is_set():
            with owner.timing():
                rec.inside("timing", f"t{i}.{n}", 0.05)
            n += 1

    def job():
        with owner.job():
            rec.inside("job", "j", 0.01)

    streams = [start(stream, i) for i in range(3)]
    time.sleep(0.2)
    asked = time.monotonic()
    j = start(job)
    j.join(5)  # a starved job fails the test rather than hanging it
    waited = time.monotonic() - asked
    stop.set()
    for t in streams + [j]:
        t.join(10)
    assert not rec.bad
    assert waited < 0.3 + 0.7, f"the job waited {waited:.2f} s behind the timing blocks"


def test_a_raising_turn_is_given_back():
    """A job or a timing block whose work raises gives its turn (and the reference child's lock) back."""
    owner = DeviceOwner(max_jobs=1)
    ref_lock = threading.Lock()
    for turn in (owner.job, lambda: owner.job(also=ref_lock), owner.timing):
        with pytest.raises(ZeroDivisionError):
            with turn():
                1 / 0
        assert owner.turns.jobs == 0 and not owner.turns.timing_on and not ref_lock.locked()
    with owner.timing():  # nothing left taken: both kinds of turn are free
        pass
    with owner.job():
        pass


def test_cancelled_waits_leave_nothing_taken():
    """An activity's cancellation arrives as an exception in its waiting thread (here: its heartbeat
    raises). A cancelled timing request must not keep jobs waiting, and a cancelled job with the reference
    child's lock must not keep that lock."""
    from gpu_worker.phases import waiting_heartbeat as _waiting_heartbeat

    class Cancelled(Exception):
        pass

    def cancelled():
        raise Cancelled()

    owner = DeviceOwner(max_jobs=2)
    release = threading.Event()

    def holder():
        with owner.job():
            release.wait(10)

    a = start(holder)
    time.sleep(0.05)
    errors = []

    def timing():
        _waiting_heartbeat(cancelled)
        try:
            with owner.timing():
                pass
        except Cancelled:
            errors.append("x")

    x = start(timing)
    x.join(5)  # waited for the job, cancelled at its first heartbeat
    assert errors == ["x"] and not owner.turns.timing_waiting
    got_in = threading.Event()
    start(lambda: (owner.job().__enter__(), got_in.set()))
    assert got_in.wait(2), "jobs waited for a cancelled timing request"
    release.set()
    a.join(5)

    # a job with the reference child's lock, cancelled while a timing block runs, gives the lock back
    ref_lock = threading.Lock()
    owner2 = DeviceOwner()
    block = owner2.timing()
    block.__enter__()

    def ref_call():
        _waiting_heartbeat(cancelled)
        try:
            with owner2.job(also=ref_lock):
                pass
        except Cancelled:
            errors.append("r")

    r = start(ref_call)
    r.join(5)
    assert errors == ["x", "r"] and not ref_lock.locked() and owner2.turns.jobs == 0 and not owner2.turns.jobs_waiting
    block.__exit__(None, None, None)


def test_waits_beat_the_activitys_heartbeat():
    # a long wait for the device must keep the activity alive (Temporal cancels one that stops beating)
    from gpu_worker.phases import waiting_heartbeat as _waiting_heartbeat

    owner = DeviceOwner()
    beats = []
    release = threading.Event()

    def holder():
        with owner.timing():
            release.wait(5)

    h = start(holder)
    time.sleep(0.05)

    def waiter():
        _waiting_heartbeat(lambda: beats.append(time.monotonic()))
        with owner.job():
            pass

    w = start(waiter)
    time.sleep(4.5)
    release.set()
    h.join(5)
    w.join(5)
    assert len(beats) >= 2  # one per 2 s of waiting


def _noted_stages(owner):
    """(order, stage): `stage(name, hold, alone)` runs a stage of `hold` seconds on the calling thread and
    notes its start and end in `order`; a stage retried alone notes first how many stages it sheds beside."""
    order, mu = [], threading.Lock()

    def note(x):
        with mu:
            order.append(x)

    def stage(name, hold, alone=False):
        # a stage retried alone starts by freeing the idle children's memory: once, as it enters
        ctx = (owner.alone(on_start=lambda: note(f"shed beside {owner.stages.turns.stages - 1}")) if alone
               else contextlib.nullcontext())
        with ctx, owner.stage():
            note(name + "+")
            with owner.stage():  # a stage inside a stage of the same thread is part of it
                pass
            time.sleep(hold)
            note(name + "-")

    return order, stage


def test_a_stage_retried_alone_runs_with_no_other_stage():
    owner = DeviceOwner()
    order, stage = _noted_stages(owner)

    first = owner.stage()
    first.__enter__()  # a stage runs
    retry = start(stage, "alone", 0.3, True)
    time.sleep(0.3)
    assert order == [] and retry.is_alive()  # the retry waits for the running stage
    late = start(stage, "late", 0.01)  # a stage arriving while the retry waits waits for it
    time.sleep(0.2)
    assert order == []
    first.__exit__(None, None, None)
    retry.join(5)
    late.join(5)
    assert order == ["shed beside 0", "alone+", "alone-", "late+", "late-"]
    assert owner.stages.turns.stages == 0 and not owner.stages.turns.alone_on and owner.stages.turns.alone_waiting == 0
    # an ordinary stage on this thread, with no retry about: no wait
    with owner.stage():
        assert owner.stages.turns.stages == 1


def test_a_retry_with_retry_beside_enters_beside_that_many_stages():
    """MARATHON_RETRY_BESIDE=1: the retried stage waits until one other stage runs, not none, sheds the idle
    children then, and a stage arriving meanwhile waits until the retry ends."""
    owner = DeviceOwner(beside=1)
    order, stage = _noted_stages(owner)

    ends = [threading.Event(), threading.Event()]

    def running(end):  # a stage of another candidate, on a thread of its own
        with owner.stage():
            end.wait(5)

    others = [start(running, e) for e in ends]
    time.sleep(0.1)
    retry = start(stage, "retry", 0.3, True)
    time.sleep(0.3)
    assert order == [] and retry.is_alive()  # two run beside: too many
    late = start(stage, "late", 0.01)
    time.sleep(0.1)
    ends[0].set()  # one left beside it: the retry enters, the late stage still waits
    time.sleep(0.1)
    assert order == ["shed beside 1", "retry+"]
    retry.join(5)
    late.join(5)
    ends[1].set()
    for t in others:
        t.join(5)
    assert order == ["shed beside 1", "retry+", "retry-", "late+", "late-"]
    assert owner.stages.turns.stages == 0 and not owner.stages.turns.alone_on


def test_a_raising_stage_retried_alone_lets_the_others_go():
    owner = DeviceOwner()
    with pytest.raises(ZeroDivisionError):
        with owner.alone(), owner.stage():
            1 / 0
    assert owner.stages.turns.stages == 0 and not owner.stages.turns.alone_on
    done = threading.Event()
    start(lambda: (owner.stage().__enter__(), done.set()))
    assert done.wait(2), "a stage waited for a retry that had ended"


def test_a_job_of_the_run_s_front_goes_before_jobs_that_asked_earlier():
    from gpu_worker.phases import set_rank

    owner, rec = DeviceOwner(max_jobs=1), Record()

    def job(name, rank, hold):
        set_rank(rank)  # what the activity's task priority sets on the step's thread
        with owner.job():
            rec.inside("job", name, hold)

    holder = start(job, "a", None, 0.3)
    time.sleep(0.05)
    behind = [start(job, f"b{i}", None, 0.01) for i in range(3)]
    time.sleep(0.05)
    front = start(job, "f", 2, 0.01)
    for t in [holder, *behind, front]:
        t.join(10)
    assert not rec.bad
    assert rec.at("f+") < min(rec.at(f"b{i}+") for i in range(3))  # asked last, went first
    assert not owner.turns.jobs_waiting
