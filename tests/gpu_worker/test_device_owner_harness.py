"""The harness's use of the device owner: the reference child's lock (no deadlock, no wait held across the
other) and a stage retried after running out of memory alone among the stages, with stand-in children."""

from __future__ import annotations

import random
import threading
import time

import pytest

from gpu_worker.harness.children import HOST_SUSPECTED
from gpu_worker.protocol import Compare, Empty, Stage, Staged
from gpu_worker.wire import Reply
from tests.gpu_worker.owner_record import Record, start


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
    proof = "host-suspected: ncu proof failed: [strong] REFUSED: not proven: the proof process did not complete"
    rep = e.children.retried_alone(attempt(proof, ok))  # a proof the host may have failed (harness.ncu_proof)
    assert rep.ok and calls == [False, True] and proof.startswith(HOST_SUSPECTED)
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
