"""The schedule's simulator (gpu_worker.device.schedule_sim) on the policies' own decisions: the owner under the H200
KDA costs laid out as the harness asked for them when the run was recorded, predicted at the measured rate
(docs/results.md, "Search throughput": 1,050 an hour past warm-up); the present harness's predicted rate held;
the dispatcher's figures and invariants; the retry alone in bursts and the proposed retry beside others; the
mechanics on a load small enough to follow by hand; a phase log's costs, recorded and present; the what-ifs
of shorter timing blocks and job turns."""

from __future__ import annotations

from gpu_worker.device.turns import DispatchTurns, OwnerTurns
from gpu_worker.device.schedule_costs import (RECORDED_BLOCK, ONE_PASS_REFILL, PRESENT, RECORDED, TURN_S, CostTable,
                                              StageCost, as_present, h200_table, seconds, table_from_activities,
                                              turn_overhead)
from gpu_worker.device.schedule_sim import simulate

SEEDS = (0, 1, 2)


def _mean(reports, key):
    return sum(getattr(r, key) for r in reports) / len(reports)


def _stage_wait(r) -> float:
    return sum(w.get("stage-wait", 0.0) for w in r.waits.values())


def test_the_recorded_harness_is_predicted_near_the_measured_rate():
    """The owner (4 job slots, 4 s windows, 24 in flight) under the costs as the harness asked for them then:
    within 15% of the measured 1,050 an hour; its timing share near the measured 36%, about two blocks a
    drain (2.0), new jobs shut out most of the time (78%)."""
    reports = [simulate(OwnerTurns(4, 4.0), h200_table(engine="recorded"), seed=s) for s in SEEDS]
    rate = _mean(reports, "evaluations_per_hour")
    assert 1050 * 0.85 <= rate <= 1050 * 1.15, rate
    assert 0.30 <= _mean(reports, "timing") <= 0.42
    assert 1.5 <= _mean(reports, "blocks_per_drain") <= 3.0
    assert 0.6 <= _mean(reports, "shut_to_jobs") <= 0.9
    assert all(not r.bad for r in reports)


def test_the_present_harness_is_predicted_at_its_rate():
    """The present policy (owner, 4 slots, 4 s windows, 24 in flight) under the costs as the harness asks for
    them now (verification one job and the comparison; the timed outputs' download in the block, the block
    as long as the one-pass refill leaves it): the predicted rate of docs/results.md ("The schedule,
    simulated"), held within about 15%."""
    reports = [simulate(OwnerTurns(4, 4.0), seed=s) for s in SEEDS]
    rate = _mean(reports, "evaluations_per_hour")
    assert 1130 <= rate <= 1520, rate
    assert 0.25 <= _mean(reports, "timing") <= 0.37
    assert all(not r.bad for r in reports)


def test_the_present_layout_asks_for_fewer_turns_and_shorter_blocks():
    """Verification: the recorded eleven turns become two (the candidate child's one job, the comparison),
    their seconds less nine turns' overhead; a benchmark's distribution loses its export job to the block,
    whose recorded timing takes ONE_PASS_REFILL of its length."""
    (rv,), (pv,) = RECORDED["verify"], PRESENT["verify"]
    assert (rv.jobs, pv.jobs) == (11, 2)
    held = lambda c: sum(seconds(s) for k, s in c.turns if k != "block")  # noqa: E731
    assert abs(held(pv) - (held(rv) - 9 * TURN_S)) < 1e-9
    assert abs(rv.host - pv.host) < 1e-9
    for rb, pb in zip(RECORDED["benchmark"], PRESENT["benchmark"]):
        blocks = sum(k == "block" for k, _ in rb.turns)
        assert pb.jobs == rb.jobs - blocks and abs(rb.host - pb.host) < 0.5
        device = lambda c: sum(seconds(s) for _, s in c.turns)  # noqa: E731
        shorter = blocks * (TURN_S + RECORDED_BLOCK * (1 - ONE_PASS_REFILL))
        assert abs(device(pb) - (device(rb) - shorter)) < 1e-9


def test_the_dispatcher_keeps_its_invariants():
    """8 job slots, batches of 2, 4 GB of declared memory: no job beside a block, never more jobs or memory
    than allowed (`bad` is the simulator's own record of the device), every candidate slot finishing
    evaluations (none starved), no wait without end."""
    reports = [simulate(DispatchTurns(8, 2, 1.0, 4.0, mem_gb=4.0), seed=s) for s in SEEDS]
    for r in reports:
        assert not r.bad, r.bad[:3]
        assert r.fewest_evaluations >= 15  # ~35 an hour per slot: none starved
        assert r.longest_job_wait < 120 and r.longest_block_wait < 120
        assert 0 < r.timing <= r.busy <= 1.0 and r.shut_to_jobs <= 1.0
    assert 700 <= _mean(reports, "evaluations_per_hour") <= 1300


def test_a_lone_candidate_waits_for_nothing():
    """One candidate, no spread, no retries: each stage takes exactly its host work and its turns, those
    before the stage gate (a child's load) included."""
    r = simulate(OwnerTurns(4, 4.0), h200_table(0.0), candidates=1, hours=0.5, warmup_s=60, retry_alone=0.0)
    (c,), (v,) = PRESENT["compile"], PRESENT["verify"]
    assert abs(r.waits["compile"]["stage"] - (c.host + TURN_S + 0.3)) < 1e-6
    verify_held = sum(seconds(s) for _, s in v.turns)
    assert abs(r.waits["verify"]["stage"] - (v.host + verify_held)) < 1e-6
    assert abs(r.waits["verify"]["gpu-job-held"] - verify_held) < 1e-6
    assert r.waits["verify"].get("gpu-job-wait", 0.0) < 1e-9 and r.waits["benchmark"].get("gpu-wait", 0.0) < 1e-9


def test_more_candidates_than_the_device_serves_wait_and_the_same_seed_gives_the_same_figures():
    a = simulate(DispatchTurns(4, 2, 1.0, 4.0), hours=0.2, seed=5)
    b = simulate(DispatchTurns(4, 2, 1.0, 4.0), hours=0.2, seed=5)
    c = simulate(DispatchTurns(4, 2, 1.0, 4.0), hours=0.2, seed=6)
    assert a == b and a != c
    assert a.waits["verify"]["gpu-job-wait"] > 3.0  # 24 in flight: the device is the queue


def test_stages_run_out_of_memory_in_bursts_and_a_retry_beside_others_drains_less():
    """Stages retried alone at the drawn share, a peak's in one burst; the proposed retry that waits for
    memory (at most 8 stages beside it) waits at the gate less than the engine's (an empty device) and
    finishes more, the invariants kept."""
    def run(beside: int, burst: int = 3):
        return [simulate(OwnerTurns(16, 8.0), retry_alone=0.03, retry_burst=burst, beside=beside, hours=0.5,
                         seed=s) for s in SEEDS]

    alone, beside = run(0), run(8)
    for r in alone:
        retried = sum(w.get("stage-alone", 0.0) for w in r.waits.values()) / 3
        assert 0.01 <= retried <= 0.06, retried  # per stage: about the 3% drawn
    assert sum(map(_stage_wait, beside)) < 0.5 * sum(map(_stage_wait, alone))
    assert _mean(beside, "evaluations_per_hour") > 1.05 * _mean(alone, "evaluations_per_hour")
    assert all(not r.bad for r in alone + beside)
    # the same retries one at a time: a drain each, so more waiting at the gate than in bursts of three
    assert sum(map(_stage_wait, run(0, burst=1))) > sum(map(_stage_wait, alone))


def test_a_what_if_scales_the_job_turns_and_the_timing_blocks_and_nothing_else():
    table = h200_table(0.0).scaled(jobs=0.5, blocks=0.58)
    for stage in ("compile", "verify", "benchmark"):
        for new, old in zip(table.samples[stage], PRESENT[stage]):
            assert abs(new.host - old.host) < 1e-9 and new.mem_gb == old.mem_gb
            for (kn, sn), (ko, so) in zip(new.turns + new.before, old.turns + old.before):
                factor = 0.58 if ko == "block" else 0.5 if ko in ("job", "ref") else 1.0
                assert kn == ko and abs(seconds(sn) - factor * seconds(so)) < 1e-9


def test_the_target_rate_is_predicted_only_with_shorter_blocks_shorter_jobs_and_no_retry_alone():
    """docs/results.md ("The schedule, simulated"): the owner with 16 job slots, 8 s windows and 48 in
    flight, no stage retried alone, reaches 2,000 an hour with the job turns at half, now that the one-pass
    refill has the timing blocks at ONE_PASS_REFILL of their recorded length; with the turns as they are, or
    the blocks as recorded, it stays short."""
    def rate(jobs: float, blocks: float) -> float:
        table = h200_table().scaled(jobs, blocks)
        return _mean([simulate(OwnerTurns(16, 8.0), table, candidates=48, retry_alone=0.0, hours=0.5, seed=s)
                      for s in SEEDS], "evaluations_per_hour")

    assert rate(0.5, 1.0) >= 2000
    assert rate(1.0, 1.0) < 2000 and rate(0.5, 1 / ONE_PASS_REFILL) < 2000


def _rows(recorded: bool) -> list[dict]:
    """Activity lines as the GPU worker logs them, by the recorded harness (outputs exported in jobs of
    their own, under "export") or the present one."""
    export = {"export": 0.4} if recorded else {}
    return [{"event": "compile", "seconds": 12.0, "phases": {"gpu-job-wait": 2.0, "gpu-job-held": 0.5,
                                                              "gpu-jobs": 2, "compile": 8.0}},
            {"event": "verify", "seconds": 20.0, "phases": {"gpu-job-wait": 15.0, "gpu-job-held": 2.2,
                                                             "stage-wait": 0.8, "run-cases": 0.5,
                                                             "run-cases.call": 0.3, "run-cases.export": 0.12,
                                                             **export}},
            {"event": "benchmark", "seconds": 30.0, "phases": {"gpu-job-wait": 18.0, "gpu-job-held": 1.1,
                                                                "gpu-jobs": 11 if recorded else 9, "gpu-wait": 3.0,
                                                                "gpu-held": 1.9, "gpu-blocks": 2, **export}},
            {"event": "record", "seconds": 1.0}]


def test_a_phase_log_gives_the_costs_as_the_present_harness_asks_for_them():
    """Host time is what the waits and turns leave; jobs share their held time in the table's proportions,
    blocks their timed time. A recorded activity is laid out as the present harness asks: verification's
    jobs of the candidate's child in one (less the merged turns' overhead, which the log's run-cases shows:
    (0.5 - 0.42) / 8 requests), each export job folded into its block; a present one is taken as it is."""
    rec = _rows(True)
    assert abs(turn_overhead(rec) - 0.01) < 1e-9 and abs(turn_overhead(_rows(False)) - 0.08) < 1e-9
    t = table_from_activities(rec)
    (c,), (v,), (b,) = t.samples["compile"], t.samples["verify"], t.samples["benchmark"]
    assert c.before[0][0] == "job" and c.turns[0][0] == "job" and abs(c.before[0][1] + c.turns[0][1] - 0.5) < 1e-9
    assert abs(c.host - 9.5) < 1e-9
    assert [k for k, _ in v.turns] == ["job", "ref"] and abs(seconds(v.turns[0][1]) + v.turns[1][1]
                                                             - (2.2 - 9 * 0.01)) < 1e-9
    assert abs(v.host - 2.0) < 1e-9  # 20 - 15 - 2.2 - 0.8
    blocks = [s for k, s in b.turns if k == "block"]
    assert b.jobs == 9 and len(blocks) == 2 and all(x > 0.95 for x in blocks)
    assert abs(sum(s for _, s in b.turns) - (1.1 + 1.9 - 2 * 0.01)) < 1e-9
    old = table_from_activities(rec, engine="recorded")
    assert old.samples["verify"][0].jobs == 11 and old.samples["benchmark"][0].jobs == 11
    now = table_from_activities(_rows(False))
    assert now.samples["verify"][0].jobs == 2 and now.samples["benchmark"][0].jobs == 9
    assert [s for k, s in now.samples["benchmark"][0].turns if k == "block"] == [0.95, 0.95]
    r = simulate(OwnerTurns(4, 4.0), t, candidates=4, hours=0.2, warmup_s=60)
    assert r.evaluations_per_hour > 0 and not r.bad


def test_as_present_leaves_a_compile_as_it_is():
    turns = (("job", 0.3),)
    assert as_present("compile", turns, 0.01) == turns


def test_a_table_must_cost_every_stage():
    try:
        CostTable({"compile": [StageCost(1.0)]})
    except ValueError as e:
        assert "verify" in str(e) and "benchmark" in str(e)
    else:
        raise AssertionError("a table without verify and benchmark was taken")


def test_the_simulated_device_records_a_policy_that_breaks_the_rules():
    """The invariants' record can fail: a policy that lets every job and block go at once is caught."""

    class Reckless(DispatchTurns):
        def job_may_start(self, ticket, job, now):
            return True

        def block_may_start(self, ticket, now):
            return self.blocks_waiting[0][0] == ticket

    r = simulate(Reckless(2, mem_gb=4.0), hours=0.05, warmup_s=30)
    assert any("beside" in b for b in r.bad)
