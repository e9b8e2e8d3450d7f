"""The device policies' decisions given the time (gpu_worker.device.turns), with no threads: the clock is
the argument."""

from __future__ import annotations

from gpu_worker.device.turns import DispatchTurns, OwnerTurns, StageTurns, Stretches, UntimedJob

JOB = UntimedJob("job", 0.2)


def test_the_owner_drains_for_a_block_and_keeps_later_jobs_out():
    t = OwnerTurns(max_jobs=2, window_s=4.0)
    a = t.ticket()
    assert t.job_may_start(a, JOB, 0.0)
    t.start_job(a, JOB, 0.0)
    x = t.ask_block(0.1)
    assert not t.block_may_start(x, 0.1)  # a job runs: the block waits for it
    late = t.ticket()
    assert not t.job_may_start(late, JOB, 0.2)  # asked after the block: waits for it
    t.end_job(a, JOB, 0.3, 0.3)
    assert t.block_may_start(x, 0.3)
    assert t.start_block(x, 0.3) is True and (t.blocks, t.windows) == (1, 1)
    t.end_block(x, 1.0, 1.3)
    assert t.job_may_start(late, JOB, 1.3) and t.window_since is None
    busy, closed = t.stretches.totals(1.3)
    assert abs(busy - 1.3) < 1e-9 and abs(closed - 1.2) < 1e-9 and t.timed_s == 1.0


def test_the_owner_window_runs_blocks_back_to_back_while_young():
    t = OwnerTurns(max_jobs=2, window_s=4.0)
    x = t.ask_block(0.0)
    t.start_block(x, 0.0)
    j = t.ticket()
    t.wait_job(j, JOB)  # a job asks while the first block runs
    y = t.ask_block(0.5)
    t.end_block(x, 1.0, 1.0)
    assert t.block_may_start(y, 1.0) and not t.job_may_start(j, JOB, 1.0)  # the window is young: y first
    assert t.start_block(y, 1.0) is False  # in the same window: no drain of its own
    t.end_block(y, 4.0, 5.0)
    z = t.ask_block(5.0)
    assert not t.block_may_start(z, 5.0) and t.job_may_start(j, JOB, 5.0)  # past window_s: the job first
    assert t.changes == 1


def test_the_dispatcher_window_is_due_by_batch_or_wait_and_jobs_must_end_before_it():
    t = DispatchTurns(max_jobs=4, batch=2, max_wait_s=1.0, window_s=4.0)
    x = t.ask_block(10.0)
    assert t.wake_at(10.0) == 11.0 and not t.block_may_start(x, 10.5)
    short, long = t.ticket(), t.ticket()
    assert t.job_may_start(short, UntimedJob("j", 0.4), 10.5)  # ends by 11.0
    assert not t.job_may_start(long, UntimedJob("j", 0.6), 10.5)  # would not: waits
    t.wait_job(long, UntimedJob("j", 0.6))
    assert t.block_may_start(x, 11.0) and t.windows == 1  # due: the window opens
    t.start_block(x, 11.0)
    t.end_block(x, 1.0, 12.0)
    assert t.window_since is None and t.owed == {long}  # it waited through the window: owed
    y = t.ask_block(12.0)
    assert t.due() is None and not t.block_may_start(y, 20.0)  # no window before the owed job starts
    t.unwait_job(long)
    t.start_job(long, UntimedJob("j", 0.6), 20.0)
    assert not t.owed and t.due() == 13.0


def test_the_dispatcher_keeps_jobs_within_the_declared_memory():
    t = DispatchTurns(max_jobs=4, mem_gb=1.0)
    a, b, c = t.ticket(), t.ticket(), t.ticket()
    big = UntimedJob("j", 0.1, 0.7)
    t.start_job(a, big, 0.0)
    assert not t.job_may_start(b, big, 0.0) and t.job_may_start(c, UntimedJob("j", 0.1, 0.3), 0.0)
    t.end_job(a, big, 0.1, 0.1)
    assert t.job_may_start(b, big, 0.1)


def test_a_stage_retried_alone_waits_for_the_others_and_keeps_new_ones_out():
    g = StageTurns()
    g.enter(False)
    g.ask(True)
    assert not g.may_enter(True) and not g.may_enter(False)
    g.leave(False)
    assert g.may_enter(True)
    g.unask(True)
    g.enter(True)
    assert not g.may_enter(False)
    g.leave(True)
    assert g.may_enter(False)


def test_a_retry_beside_others_waits_for_room_not_for_an_empty_device():
    """The proposed policy (`beside`): the retried stage enters with up to `beside` others running, none
    entering while it waits; while it runs, others enter up to `beside` beside it."""
    g = StageTurns(beside=2)
    for _ in range(3):
        g.enter(False)
    g.ask(True)
    assert not g.may_enter(True) and not g.may_enter(False)
    g.leave(False)
    assert g.may_enter(True)
    g.unask(True)
    g.enter(True)
    assert not g.may_enter(False)  # two beside it already
    g.leave(False)
    assert g.may_enter(False)
    g.enter(False)
    g.ask(True)
    assert not g.may_enter(True)  # one retried stage at a time
    g.unask(True)
    g.leave(True)
    assert g.may_enter(False)


def test_stretches_are_told_as_they_end():
    told = []
    s = Stretches(on_busy=told.append)
    s.update(1.0, True, False)
    s.update(3.5, False, False)
    assert told == [2.5] and s.totals(4.0) == (2.5, 0.0)


def test_the_owner_lets_a_lower_rank_go_first_unless_a_block_holds_it_back():
    # ranks: a stage's task priority (2 the run's oldest unrecorded iteration, 3 the default)
    t = OwnerTurns(max_jobs=1, window_s=4.0)
    a = t.ticket()
    t.start_job(a, JOB, 0.0)
    later, front = t.ticket(), t.ticket()
    t.wait_job(later, JOB)
    t.wait_job(front, UntimedJob("job", 0.2, rank=2))
    t.end_job(a, JOB, 0.1, 0.1)
    assert not t.job_may_start(later, JOB, 0.1) and t.job_may_start(front, UntimedJob("job", 0.2, rank=2), 0.1)
    t.start_job(front, UntimedJob("job", 0.2, rank=2), 0.1)
    t.end_job(front, JOB, 0.1, 0.2)
    assert t.job_may_start(later, JOB, 0.2)
    # a ranked job that asked after a waiting block waits for it, and holds back no job the block waits for
    # (else the three would wait for each other)
    t.start_job(later, JOB, 0.2)
    first, x, ranked = t.ticket(), None, None
    t.wait_job(first, JOB)
    x = t.ask_block(0.3)
    ranked = t.ticket()
    t.wait_job(ranked, UntimedJob("job", 0.2, rank=1))
    t.end_job(later, JOB, 0.2, 0.4)
    assert t.job_may_start(first, JOB, 0.4) and not t.job_may_start(ranked, UntimedJob("job", 0.2, rank=1), 0.4)


def test_the_dispatcher_admits_a_lower_rank_first_among_the_jobs_that_fit():
    t = DispatchTurns(max_jobs=1, batch=2, max_wait_s=1.0)
    a = t.ticket()
    t.start_job(a, JOB, 0.0)
    later, front = t.ticket(), t.ticket()
    ranked = UntimedJob("job", 0.2, rank=2)
    t.wait_job(later, JOB)
    t.wait_job(front, ranked)
    t.end_job(a, JOB, 0.1, 0.1)
    assert not t.job_may_start(later, JOB, 0.1) and t.job_may_start(front, ranked, 0.1)
