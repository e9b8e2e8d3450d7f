"""The device owner (gpu_worker.device.owner.DeviceOwner): timing blocks alone on the device, untimed jobs
between them and bounded, neither side starved, every turn given back on every path, and a stage retried
after running out of memory alone among the stages; and the harness's use of it with the reference child's
lock (no deadlock, no wait held across the other)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from gpu_worker.device.owner import DeviceOwner
from gpu_worker.protocol import Compare, Empty, Stage, Staged
from gpu_worker.wire import Reply
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
        ctx = owner.alone(on_start=lambda: note(f"shed beside {owner.stages.turns.stages - 1}")) if alone else _null()
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


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- the harness's turns with the reference child's lock --------------------------------------------------
def _evaluator(tmp_path, policy: str = "owner"):
    """An evaluator whose device turns are the owner's, or the dispatcher's (gpu_worker.device.dispatcher)."""
    from gpu_worker.device.dispatcher import DeviceDispatcher
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler
    from workflows.artifacts import ArtifactStore

    owner = DeviceDispatcher(batch=2, max_wait_s=0.01) if policy == "dispatcher" else None
    e = Evaluator(store=ArtifactStore(tmp_path / "art"), interpreter=True,
                  scheduler=Scheduler(spares=0, owner=owner))
    e.ctx.cuda = True  # the device owner is only used with a device; nothing below touches one
    return e


def test_reference_wait_holds_no_device_turn(tmp_path):
    """A call queued for the (serial) reference child waits outside any device turn: a timing block is
    not held up by that queue. The owner is the real one; the child is a stand-in."""
    e = _evaluator(tmp_path)

    class Child:
        def call(self, request, timeout, hb=None):
            held.append(e.owner.turns.jobs)  # the jobs on the device while the reference child works
            return Reply(seq=None, result=Empty())

    held = []
    ref_lock = threading.Lock()
    e.refs.child = lambda problem, shape, hb: (Child(), ref_lock, {"baseline": "stand-in"})
    ref_lock.acquire()  # the reference child is busy with someone else's call
    caller = start(e.refs.call, None, None, None, Compare(jobs=[]), 10)
    time.sleep(0.2)  # the caller now waits for the child
    timed = threading.Event()

    def timing():
        with e.turns.timing():
            timed.set()

    t = start(timing)
    assert timed.wait(2), "a timing block waited for a call queued on the reference child"
    t.join(5)
    ref_lock.release()
    caller.join(5)
    assert held == [1]  # the call itself ran as a device job
    e.close()


def test_reference_lock_not_held_while_a_timing_block_runs(tmp_path):
    """The converse: a call that has the reference child's lock but must wait for a timing block gives the
    lock back while it waits, so the child serves others meanwhile; then it runs as a job, lock held."""
    e = _evaluator(tmp_path)
    ref_lock = threading.Lock()
    ran = []

    class Child:
        def call(self, request, timeout, hb=None):
            ran.append((request.cmd, e.owner.turns.jobs, ref_lock.locked()))
            return Reply(seq=None, result=Staged(seconds=0.0))

    e.refs.child = lambda problem, shape, hb: (Child(), ref_lock, {})
    block = e.turns.timing()
    block.__enter__()
    caller = start(e.refs.call, None, None, None, Stage(cases=[]), 10)
    time.sleep(0.3)
    assert ref_lock.acquire(timeout=2), "the reference child's lock was held while waiting for the device"
    ref_lock.release()
    assert ran == []  # nothing ran during the timing block
    block.__exit__(None, None, None)
    caller.join(5)
    assert ran == [("stage", 1, True)]
    # a timing block with the child: the turn first, then the lock
    with e.turns.with_ref(ref_lock, timing=True):
        assert e.owner.turns.timing_on and ref_lock.locked()
    assert not ref_lock.locked() and not e.owner.turns.timing_on
    e.close()


@pytest.mark.parametrize("policy", ["owner", "dispatcher"])
def test_turns_and_reference_lock_mixed_load_never_deadlocks(tmp_path, policy):
    """Threads mixing every way the harness takes a turn (a job, a job with the reference child's lock, a
    timing block, a timing block then the child's lock) all finish, and a timing block never overlaps a
    job or another block."""
    e = _evaluator(tmp_path, policy)
    e.owner.turns.max_jobs = 3
    ref_lock = threading.Lock()
    rec = Record()

    def worker(seed):
        rnd = random.Random(seed)
        for n in range(60):
            way = rnd.randrange(4)
            hold = rnd.uniform(0, 0.002)
            if way == 0:
                with e.turns.job():
                    rec.inside("job", f"{seed}.{n}", hold)
            elif way == 1:
                with e.turns.with_ref(ref_lock):
                    rec.inside("job", f"{seed}.{n}", hold)
            elif way == 2:
                with e.turns.timing():
                    rec.inside("timing", f"{seed}.{n}", hold)
            else:
                with e.turns.with_ref(ref_lock, timing=True):
                    rec.inside("timing", f"{seed}.{n}", hold)

    threads = [start(worker, i) for i in range(8)]
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "deadlock: a thread never finished"
    assert not rec.bad and rec.most_jobs <= 3, rec.bad[:3]
    e.close()


@pytest.mark.parametrize("policy", ["owner", "dispatcher"])
def test_out_of_memory_beside_others_is_retried_alone(tmp_path, policy):
    """An OOM (or a child killed from outside) may be the neighbours' doing: the stage runs once more alone
    among the stages, and only what fails then is the candidate's. Other rejections are not retried."""
    from workflows.contracts import CompileReport, VerifyReport

    e = _evaluator(tmp_path, policy)
    calls = []

    def attempt(first_reason, then):
        def run():
            calls.append(bool(getattr(e.owner.stages._local, "alone", False)))
            if len(calls) == 1:
                return VerifyReport(ok=False, stage="sandbox", reason=first_reason, seconds=2.0,
                                    log_key=e.ctx.log(first_reason))
            return then
        return run

    ok = VerifyReport(ok=True, rel_err=1e-3, seconds=3.0, log_key=e.ctx.log("passed"))
    rep = e.children.retried_alone(attempt("oom: OutOfMemoryError: CUDA out of memory", ok))
    assert rep.ok and calls == [False, True] and rep.seconds == 5.0
    log = e.store.get_text(rep.log_key)
    assert log.startswith("first attempt beside other candidates: oom:") and log.rstrip().endswith("passed")
    calls.clear()
    still = VerifyReport(ok=False, stage="sandbox", reason="oom: again, alone", seconds=1.0)
    rep = e.children.retried_alone(attempt("crash: sandbox process died with SIGKILL during verify", still))
    assert not rep.ok and rep.reason == "oom: again, alone" and calls == [False, True]
    for reason in ("verify: wrong output", "crash: sandbox process died with SIGSEGV during verify"):
        calls.clear()
        rep = e.children.retried_alone(attempt(reason, ok))
        assert not rep.ok and rep.reason == reason and calls == [False]  # the candidate's own failure
    # compile reports carry the reason as `error`
    calls.clear()
    rep = e.children.retried_alone(lambda: (calls.append(1), CompileReport(ok=False, error="oom: x") if len(calls) == 1
                                    else CompileReport(ok=True))[1])
    assert rep.ok and len(calls) == 2
    e.ctx.cuda = False  # on the CPU (no device owner at work) nothing is retried
    calls.clear()
    assert not e.children.retried_alone(attempt("oom: x", ok)).ok and calls == [False]
    e.close()


@pytest.mark.parametrize("policy", ["owner", "dispatcher"])
def test_a_stage_retried_alone_loads_its_child_with_no_other_stage_running(tmp_path, policy):
    """The retry is alone from its start: the steps before its stage's gate (a fresh child's CUDA context
    and load, which ran out of memory beside others on an 80 GB H100) wait for the neighbours' stages too."""
    from workflows.contracts import VerifyReport

    e = _evaluator(tmp_path, policy)
    events, entered = [], threading.Event()

    def neighbour():
        with e.turns.stage():
            entered.set()
            time.sleep(0.5)
            events.append("the neighbour's stage ends")

    t = threading.Thread(target=neighbour)
    t.start()
    assert entered.wait(10)
    calls = []

    def attempt():
        calls.append(1)
        if len(calls) == 1:
            return VerifyReport(ok=False, stage="sandbox", reason="oom: AcceleratorError: CUDA error: out of memory")
        events.append("the retry loads its child")
        with e.turns.stage():
            events.append("the retry's stage")
        return VerifyReport(ok=True, rel_err=1e-3)

    rep = e.children.retried_alone(attempt)
    t.join(10)
    assert rep.ok and events == ["the neighbour's stage ends", "the retry loads its child", "the retry's stage"]
    e.close()


def test_the_reference_process_out_of_memory_beside_others_retries_the_stage_alone(tmp_path):
    """The trusted reference child's allocation failing beside the candidates' memory is no candidate's
    fault and no infrastructure failure: the stage runs again alone; failing alone too, it is the harness's."""
    import pytest

    from gpu_worker.harness.children import ReferenceOutOfMemory
    from workflows.contracts import VerifyReport

    e = _evaluator(tmp_path)
    calls = []

    class Kept:  # a child kept between a candidate's stages
        closed = False

        def alive(self):
            return not self.closed

        def close(self):
            self.closed = True

    kept = Kept()
    e.loaded.put(("kda", "B1", "k"), kept)

    def attempt(then):
        def run():
            with e.owner.stage():
                calls.append(bool(getattr(e.owner.stages._local, "alone", False)))
                if len(calls) == 1 or then is None:
                    raise ReferenceOutOfMemory("oom: the reference process's compare_timed: CUDA out of memory")
                return then
        return run

    ok = VerifyReport(ok=True, rel_err=1e-3, seconds=3.0, log_key=e.ctx.log("passed"))
    rep = e.children.retried_alone(attempt(ok))
    assert rep.ok and calls == [False, True] and rep.seconds == 3.0
    assert kept.closed and len(e.loaded) == 0, "the retry alone runs with the idle children's memory freed"
    assert e.store.get_text(rep.log_key).startswith(
        "first attempt beside other candidates: oom: the reference process's compare_timed")
    calls.clear()
    with pytest.raises(ReferenceOutOfMemory):
        e.children.retried_alone(attempt(None))
    assert calls == [False, True]
    e.ctx.cuda = False  # on the CPU nothing is retried: the error is the harness's at once
    calls.clear()
    with pytest.raises(ReferenceOutOfMemory):
        e.children.retried_alone(attempt(ok))
    assert calls == [False]
    e.close()
