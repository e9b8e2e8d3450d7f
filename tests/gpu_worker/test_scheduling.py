"""The scheduler's parts (gpu_worker.device.scheduling): the timing cores split from the rest, warm spares readied
side by side before they are handed out, and the loaded children kept for hand-on, by number and age."""

from __future__ import annotations

import time

import pytest

from gpu_worker.protocol import CudaInit


def _cores_setting(value: str):
    from gpu_worker.settings import GpuWorkerSettings

    return GpuWorkerSettings.from_env({"MARATHON_TIMING_CPUS": value}).timing_cpus


def test_timing_cpus_split():
    import os

    from gpu_worker.device.scheduling import timing_cpus

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    n = len(os.sched_getaffinity(0))
    split = timing_cpus(_cores_setting("1"))
    if n < 2:
        assert split is None
    else:
        timed, rest = split
        assert len(timed) == 1 and len(rest) == n - 1 and not timed & rest
    assert timing_cpus(_cores_setting("0")) is None


def test_timing_cpus_explicit():
    import os

    from gpu_worker.device.scheduling import timing_cpus

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one core")
    timed, rest = timing_cpus(_cores_setting(f"{cpus[-1]}-{cpus[-1]}"))
    assert timed == {cpus[-1]} and rest == set(cpus[:-1])
    assert timing_cpus(_cores_setting("9999,10000")) is None  # cores this host does not have: no split


def test_pool_readies_spares_before_handing_them_out():
    # on CUDA the harness passes its CandidateChildren.cuda_init here (the context is made in an untimed device job);
    # the same path on the CPU: spares start side by side, are readied side by side (each once), then handed out
    import time as _t

    from gpu_worker.device.scheduling import SandboxPool

    import threading

    readied = []
    # both spares must be readied at once (side by side): readied one after another, the first would wait
    # here for the second until the barrier broke, and would be dropped
    both = threading.Barrier(2, timeout=60)

    def ready(sb):
        r = sb.call(CudaInit(), 120)
        assert r.ok and r.result.cuda is False
        both.wait()
        readied.append(sb)

    pool = SandboxPool(interpreter=True, spares=2, ready=ready)
    try:
        end = _t.monotonic() + 120
        while len(pool._idle) < 2 and _t.monotonic() < end:
            _t.sleep(0.2)
        assert len(readied) == 2 and len(pool._idle) == 2
        sb = pool.acquire()
        assert sb in readied and sb.alive()
        sb.close()
    finally:
        pool.close()


class Child:  # what LoadedChildren uses of a Sandbox
    def __init__(self):
        self.closed = False

    def alive(self):
        return not self.closed

    def close(self):
        self.closed = True


def test_loaded_children_limit_and_age():
    from gpu_worker.device.scheduling import LoadedChildren

    kept = LoadedChildren(limit=2, ttl=60, parked_room=0)
    a, b, c = Child(), Child(), Child()
    kept.put("a", a)
    kept.put("b", b)
    kept.put("c", c)  # over the limit: the oldest is closed
    assert a.closed and not b.closed and len(kept) == 2
    assert kept.take("b") is b and kept.take("b") is None
    c.close()
    assert kept.take("c") is None  # a dead child is not handed on
    old = LoadedChildren(limit=4, ttl=0.0)
    d = Child()
    old.put("d", d)
    assert old.take("d") is None and d.closed  # too old
    e, f = Child(), Child()
    kept.put("e", e)
    kept.put("f", f)
    assert kept.shed() == 2 and e.closed and f.closed and len(kept) == 0  # for a stage retried alone
    kept.put("g", Child())  # and kept again after
    kept.close()
    assert len(kept) == 0
    # several children of one candidate (the best, in overlapping benchmarks), at most per_key of them
    many = LoadedChildren(limit=8, ttl=60, per_key=2, parked_room=0)
    x1, x2, x3 = Child(), Child(), Child()
    many.put("x", x1)
    many.put("x", x2)
    many.put("x", x3)  # a third copy: the oldest goes
    assert x1.closed and not x2.closed and not x3.closed and len(many) == 2
    got = {many.take("x"), many.take("x")}
    assert got == {x2, x3} and many.take("x") is None


def test_shed_spares_are_made_again_at_the_next_acquire():
    # a stage retried alone frees the spares' memory; the pool is not closed by it
    import time as _t

    from gpu_worker.device.scheduling import SandboxPool

    pool = SandboxPool(interpreter=True, spares=1)
    try:
        spare = pool._idle[0]
        assert pool.shed() == 1 and not spare.alive() and not pool._idle
        sb = pool.acquire()
        assert sb.alive() and sb is not spare
        sb.close()
        end = _t.monotonic() + 60
        while not pool._idle and _t.monotonic() < end:
            _t.sleep(0.2)
        assert len(pool._idle) == 1, "the pool fills again after an acquire"
    finally:
        pool.close()


def test_sweep_closes_the_children_past_their_ttl():
    """Loaded children kept between stages expire on an idle worker too, not only when the next stage comes."""
    from gpu_worker.device.scheduling import LoadedChildren

    kept = LoadedChildren(limit=4, ttl=0.1)
    a = Child()
    kept.put("a", a)
    time.sleep(0.2)
    assert kept.sweep() == 1 and a.closed and len(kept) == 0


def test_an_idle_worker_closes_its_kept_children_without_new_work():
    from gpu_worker.device.scheduling import LoadedChildren

    kept = LoadedChildren(limit=4, ttl=0.1)
    a, b = Child(), Child()
    kept.put("a", a)
    kept.put("b", b)
    kept.sweep_every(0.05)
    deadline = time.monotonic() + 5
    while not (a.closed and b.closed) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert a.closed and b.closed and len(kept) == 0


def test_sweep_keeps_children_within_their_ttl():
    from gpu_worker.device.scheduling import LoadedChildren

    kept = LoadedChildren(limit=4, ttl=60)
    a = Child()
    kept.put("a", a)
    assert kept.sweep() == 0 and not a.closed and kept.take("a") is a


def test_a_compile_waits_for_room_for_its_child_and_the_parked_go_first():
    """Compiles are admitted while the children waiting for their next stage and the compiles admitted
    before stay below the limit (the parked, the best's copies, have room of their own); a take lets the
    next one in; the wait is bounded. Beyond the cap the oldest parked child goes, not the next to be
    verified."""
    import threading

    from gpu_worker.device.scheduling import LoadedChildren

    kept = LoadedChildren(limit=2, ttl=60, per_key=2, parked_room=2, admit_wait_s=5.0)
    best = [Child(), Child()]
    for c in best:
        kept.put("best", c, parked=True)
    with kept.admission() as waited:
        assert waited < 0.5
        kept.put("a", Child())
    entered = []

    def compile_b():
        with kept.admission() as w:
            entered.append(w)
            kept.put("b", Child())

    with kept.admission():  # a second compile under way: "a" waiting and this one fill the room
        t = threading.Thread(target=compile_b)
        t.start()
        time.sleep(0.4)
        assert entered == []  # "b" waits
        c = Child()
        kept.put("c", c)
    time.sleep(0.4)
    assert entered == []  # "a" and "c" wait for their verification: still no room
    assert kept.take("a") is not None  # a's verification takes its child: b enters
    t.join(5)
    assert len(entered) == 1 and 0.5 < entered[0] < 5.0
    # over the cap (2 parked + c + b + one more): the oldest parked child is closed, not c
    d = Child()
    kept.put("d", d)
    assert best[0].closed and not best[1].closed and not c.closed and not d.closed and len(kept) == 4
    # the wait is bounded: a full room lets a compile in after admit_wait_s
    short = LoadedChildren(limit=1, ttl=60, admit_wait_s=0.3)
    short.put("x", Child())
    with short.admission() as w:
        assert 0.3 <= w < 1.5
    # a child no stage came for (a compile tool's draft) stops holding the room after stage_wait_s, and is
    # among the first to go
    drafts = LoadedChildren(limit=1, ttl=60, parked_room=1, admit_wait_s=5.0, stage_wait_s=0.3)
    draft = Child()
    drafts.put("draft", draft)
    with drafts.admission() as w:
        assert 0.2 <= w < 1.5
        fresh = Child()
        drafts.put("fresh", fresh)
    drafts.put("next", Child())
    assert draft.closed and not fresh.closed
