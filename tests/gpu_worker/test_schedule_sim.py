"""The schedule's simulator (gpu_worker.schedule_sim) on the policies' own decisions: the present owner
policy under the H200 KDA costs predicted at the measured rate (docs/results.md, "Search throughput": 1,050
an hour past warm-up), the dispatcher's figures and invariants, the mechanics on a load small enough to
follow by hand, a phase log's costs replayed."""

from __future__ import annotations

from gpu_worker.device_turns import DispatchTurns, OwnerTurns
from gpu_worker.schedule_costs import H200_KDA, CostTable, StageCost, h200_table, table_from_activities
from gpu_worker.schedule_sim import simulate

SEEDS = (0, 1, 2)


def _mean(reports, key):
    return sum(getattr(r, key) for r in reports) / len(reports)


def test_the_owner_is_predicted_near_the_measured_rate():
    """The present policy (4 job slots, 4 s windows, 24 in flight) under the H200 costs: within 15% of the
    measured 1,050 an hour; its timing share near the measured 36% and about two blocks a drain (2.0)."""
    reports = [simulate(OwnerTurns(4, 4.0), seed=s) for s in SEEDS]
    rate = _mean(reports, "evaluations_per_hour")
    assert 1050 * 0.85 <= rate <= 1050 * 1.15, rate
    assert 0.30 <= _mean(reports, "timing") <= 0.42
    assert 1.5 <= _mean(reports, "blocks_per_drain") <= 3.0
    assert all(not r.bad for r in reports)


def test_the_dispatcher_keeps_its_invariants_and_its_predicted_figures():
    """8 job slots, batches of 2, 4 GB of declared memory: no job beside a block, never more jobs or memory
    than allowed (`bad` is the simulator's own record of the device), every candidate slot finishing
    evaluations (none starved), no wait without end; its rate and busy share where they were predicted."""
    reports = [simulate(DispatchTurns(8, 2, 1.0, 4.0, mem_gb=4.0), seed=s) for s in SEEDS]
    for r in reports:
        assert not r.bad, r.bad[:3]
        assert r.fewest_evaluations >= 15  # ~35 an hour per slot: none starved
        assert r.longest_job_wait < 60 and r.longest_block_wait < 60
        assert 0 < r.timing <= r.busy <= 1.0 and r.shut_to_jobs <= 1.0
    assert 700 <= _mean(reports, "evaluations_per_hour") <= 1000
    assert 0.75 <= _mean(reports, "busy") <= 0.95


def test_a_lone_candidate_waits_for_nothing():
    """One candidate, no spread, no retries: each stage takes exactly its host work and its turns."""
    r = simulate(OwnerTurns(4, 4.0), h200_table(0.0), candidates=1, hours=0.5, warmup_s=60, retry_alone=0.0)
    c, v = H200_KDA["compile"][0], H200_KDA["verify"][0]
    assert abs(r.waits["compile"]["stage"] - (c.host_s + 0.3)) < 1e-6
    assert abs(r.waits["verify"]["stage"] - (v.host_s + 2.0 + 11 * v.gap_s)) < 1e-6
    assert r.waits["verify"].get("gpu-job-wait", 0.0) < 1e-9 and r.waits["benchmark"].get("gpu-wait", 0.0) < 1e-9
    assert abs(r.waits["verify"]["gpu-job-held"] - 2.0) < 1e-6


def test_more_candidates_than_the_device_serves_wait_and_the_same_seed_gives_the_same_figures():
    a = simulate(DispatchTurns(4, 2, 1.0, 4.0), hours=0.2, seed=5)
    b = simulate(DispatchTurns(4, 2, 1.0, 4.0), hours=0.2, seed=5)
    c = simulate(DispatchTurns(4, 2, 1.0, 4.0), hours=0.2, seed=6)
    assert a == b and a != c
    assert a.waits["verify"]["gpu-job-wait"] > 5.0  # 24 in flight: the device is the queue


def test_a_phase_log_gives_the_costs():
    """Activity lines as the GPU worker logs them: host time is what the waits and turns leave; jobs and
    blocks share their held time; the layout (which job takes the reference child's lock) is the table's."""
    rows = [{"event": "compile", "seconds": 12.0, "phases": {"gpu-job-wait": 2.0, "gpu-job-held": 0.5,
                                                              "gpu-jobs": 1, "compile": 8.0}},
            {"event": "verify", "seconds": 20.0, "phases": {"gpu-job-wait": 15.0, "gpu-job-held": 2.2,
                                                             "stage-wait": 0.8}},
            {"event": "benchmark", "seconds": 30.0, "phases": {"gpu-job-wait": 18.0, "gpu-job-held": 1.1,
                                                                "gpu-jobs": 11, "gpu-wait": 3.0, "gpu-held": 1.9,
                                                                "gpu-blocks": 2}},
            {"event": "record", "seconds": 1.0}]
    t = table_from_activities(rows)
    (c,), (v,), (b,) = t.samples["compile"], t.samples["verify"], t.samples["benchmark"]
    assert c.turns == (("job", 0.5),) and abs(c.host_s - 9.5) < 1e-9
    assert v.jobs == 11 and abs(sum(s for _, s in v.turns) - 2.2) < 1e-9 and v.turns[-1][0] == "ref"
    assert abs(v.host_s + 11 * v.gap_s - 2.0) < 1e-9  # 20 - 15 - 2.2 - 0.8
    assert b.jobs == 11 and [s for k, s in b.turns if k == "block"] == [0.95, 0.95]
    r = simulate(OwnerTurns(4, 4.0), t, candidates=4, hours=0.2, warmup_s=60)
    assert r.evaluations_per_hour > 0 and not r.bad


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
