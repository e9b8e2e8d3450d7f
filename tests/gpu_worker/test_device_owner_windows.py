"""The device owner's timing windows (gpu_worker.device.owner): once the device is drained of jobs for a
timing block, the blocks waiting and those arriving meanwhile run back to back before jobs come back, one
drain for several blocks; no job ever beside a block; jobs still get turns under a stream of blocks; a block
that raises or is cancelled does not stop the ones after it. Recorded with a stand-in for the device."""

from __future__ import annotations

import random
import threading
import time

import pytest

from gpu_worker.device import owner as device_owner
from gpu_worker.device.owner import DeviceOwner
from gpu_worker.phases import phases_begin, phases_end, waiting_heartbeat
from tests.gpu_worker.owner_record import Record, start


def _no_job_inside(rec: Record, first: str, last: str) -> bool:
    """No job went on the device between block `first`'s start and block `last`'s end."""
    lo, hi = rec.at(first + "+"), rec.at(last + "-")
    return not [n for n, t in rec.log if n.startswith("j") and n.endswith("+") and lo <= t <= hi]


def _until(ready, timeout: float = 5.0) -> None:
    """Wait until `ready()`: the next request asks only once the one before it is queued or on the device."""
    end = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < end, "the owner never got there"
        time.sleep(0.002)


def _on(rec: Record, name: str) -> bool:
    return any(n == name + "+" for n, _ in rec.log)


def _idle(owner: DeviceOwner) -> bool:
    return (owner.turns.jobs == 0 and not owner.turns.timing_on and not owner.turns.timing_waiting and not owner.turns.jobs_waiting
            and owner.turns.window_since is None)


def test_waiting_timing_blocks_share_one_drain():
    owner, rec = DeviceOwner(max_jobs=2, window_s=10), Record()
    phases: dict[str, dict] = {}

    def job(name, hold):
        with owner.job():
            rec.inside("job", name, hold)

    def timing(name, hold):
        phases_begin()
        try:
            with owner.timing():
                rec.inside("timing", name, hold)
        finally:
            phases[name] = phases_end()

    a, b = start(job, "j1", 0.4), start(job, "j2", 0.4)  # on the device: x1 drains them
    _until(lambda: _on(rec, "j1") and _on(rec, "j2"))
    x1 = start(timing, "x1", 0.1)
    _until(lambda: len(owner.turns.timing_waiting) == 1)
    j3 = start(job, "j3", 0.01)  # asked before x2 and x3: one at a time, it would cost each its own drain
    _until(lambda: owner.turns.jobs_waiting)
    x2 = start(timing, "x2", 0.1)
    _until(lambda: len(owner.turns.timing_waiting) == 2)
    x3 = start(timing, "x3", 0.1)
    _until(lambda: _on(rec, "x1"))
    x4 = start(timing, "x4", 0.1)  # arrives while the window's first block runs: joins it
    for t in (a, b, x1, j3, x2, x3, x4):
        t.join(10)
    assert not rec.bad
    assert rec.order() == ["j1", "j2", "x1", "x2", "x3", "x4", "j3"]
    assert rec.at("x1+") >= max(rec.at("j1-"), rec.at("j2-"))
    assert _no_job_inside(rec, "x1", "x4")
    assert (owner.blocks, owner.windows) == (4, 1)
    # the phase log: every block counted, one drain, on the block that waited for it
    assert [phases[x].get("gpu-blocks") for x in ("x1", "x2", "x3", "x4")] == [1, 1, 1, 1]
    assert [phases[x].get("gpu-drains", 0) for x in ("x1", "x2", "x3", "x4")] == [1, 0, 0, 0]
    # closed to jobs from x1's request to x4's end, one stretch
    assert owner.closed_s >= rec.at("x4-") - rec.at("x1+") + 0.1
    assert _idle(owner)


def test_past_its_time_a_window_runs_only_blocks_that_asked_before_a_waiting_job():
    # window_s 0: a block goes ahead of no job that asked before it; blocks that asked before the job still
    # follow in the same window, without a drain of their own
    owner, rec = DeviceOwner(max_jobs=2, window_s=0), Record()

    def job(name, hold):
        with owner.job():
            rec.inside("job", name, hold)

    def timing(name, hold):
        with owner.timing():
            rec.inside("timing", name, hold)

    x1 = start(timing, "x1", 0.3)
    _until(lambda: _on(rec, "x1"))
    x2 = start(timing, "x2", 0.05)
    _until(lambda: len(owner.turns.timing_waiting) == 1)
    j = start(job, "j", 0.05)
    _until(lambda: owner.turns.jobs_waiting)
    x3 = start(timing, "x3", 0.05)
    for t in (x1, x2, j, x3):
        t.join(10)
    assert not rec.bad
    assert rec.order() == ["x1", "x2", "j", "x3"]
    assert (owner.blocks, owner.windows) == (3, 2)  # x1 and x2 shared one; x3 waited for the job
    assert _idle(owner)


def test_jobs_get_turns_under_a_steady_stream_of_blocks():
    window = 0.3
    owner, rec = DeviceOwner(max_jobs=2, window_s=window), Record()
    stop = threading.Event()
    waits: list[float] = []

    def blocks(i):
        n = 0
        while not stop.is_set():  # each block asks again as soon as its last one ended
            with owner.timing():
                rec.inside("timing", f"t{i}.{n}", 0.03)
            n += 1

    def jobs(i):
        for n in range(4):
            asked = time.monotonic()
            with owner.job():
                waits.append(time.monotonic() - asked)
                rec.inside("job", f"j{i}.{n}", 0.02)
            time.sleep(0.05)

    streams = [start(blocks, i) for i in range(3)]
    time.sleep(0.1)
    askers = [start(jobs, i) for i in range(2)]
    for t in askers:
        t.join(30)
    stop.set()
    for t in streams:
        t.join(10)
    assert not any(t.is_alive() for t in askers + streams)
    assert not rec.bad and len(waits) == 8
    # a job waits for at most the window's time and the block under way then (margin for a loaded host)
    assert max(waits) < window + 0.5, f"a job waited {max(waits):.2f} s behind the timing blocks"
    assert owner.blocks > 2 * owner.windows  # the blocks shared drains
    assert _idle(owner)


def test_a_raising_or_cancelled_block_does_not_stop_the_next(monkeypatch):
    monkeypatch.setattr(device_owner, "WAIT_S", 0.05)  # waiters look (and beat) often: the cancel lands fast
    owner, rec = DeviceOwner(max_jobs=2, window_s=10), Record()
    release, cancel = threading.Event(), threading.Event()
    errors: list[str] = []

    class Cancelled(Exception):
        pass

    def first():
        with owner.timing():
            rec.inside("timing", "x1", 0)
            release.wait(10)

    def raising():
        try:
            with owner.timing():
                rec.inside("timing", "x2", 0.02)
                1 / 0
        except ZeroDivisionError:
            errors.append("x2")

    def cancelled():
        def hb():
            if cancel.is_set():
                raise Cancelled()

        waiting_heartbeat(hb)
        try:
            with owner.timing():
                rec.inside("timing", "x3", 0.02)
        except Cancelled:
            errors.append("x3")

    def timing(name):
        with owner.timing():
            rec.inside("timing", name, 0.02)

    def job():
        with owner.job():
            rec.inside("job", "j", 0.01)

    x1 = start(first)
    _until(lambda: _on(rec, "x1"))
    j = start(job)  # asked before the blocks below: they run ahead of it in x1's window
    _until(lambda: owner.turns.jobs_waiting)
    threads = [start(raising)]
    _until(lambda: len(owner.turns.timing_waiting) == 1)
    threads.append(start(cancelled))
    _until(lambda: len(owner.turns.timing_waiting) == 2)
    threads.append(start(timing, "x4"))
    _until(lambda: len(owner.turns.timing_waiting) == 3)
    cancel.set()
    threads[1].join(5)
    assert errors == ["x3"] and owner.turns.timing_on  # cancelled while waiting, x1 still under way
    release.set()
    for t in [x1, j] + threads:
        t.join(10)
    assert errors == ["x3", "x2"]
    assert not rec.bad
    assert rec.order() == ["x1", "x2", "x4", "j"]
    assert (owner.blocks, owner.windows) == (3, 1)
    assert _idle(owner)
    with owner.timing():  # nothing left taken
        pass
    with owner.job():
        pass


@pytest.mark.parametrize("window_s", [0.0, 0.01, 1.0])
def test_mixed_load_never_puts_a_job_beside_a_block(window_s):
    owner, rec = DeviceOwner(max_jobs=3, window_s=window_s), Record()

    def worker(seed):
        rnd = random.Random(seed)
        for n in range(40):
            if rnd.random() < 0.5:
                with owner.job():
                    rec.inside("job", f"j{seed}.{n}", rnd.uniform(0, 0.003))
            else:
                with owner.timing():
                    rec.inside("timing", f"t{seed}.{n}", rnd.uniform(0, 0.003))

    threads = [start(worker, i) for i in range(6)]
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread never finished"
    assert not rec.bad and rec.most_jobs <= 3, rec.bad[:3]
    assert owner.blocks == sum(1 for n in rec.order() if n.startswith("t")) and owner.windows <= owner.blocks
    assert _idle(owner)
