"""The loop's decisions as plain functions, no server."""

from __future__ import annotations

import pytest

from workflows import decisions
from workflows.contracts import (BenchReport, BestRef, Budget, BudgetChange, IterationRecord, LeaderEntry, Used)


def _best(speedup=2.0):
    return BestRef(candidate_id="b", source_key="k", speedup=speedup, time_ms=1.0, baseline_ms=2.0, iteration=1)


def test_limit_reached_names_the_first_exhausted_budget():
    assert decisions.limit_reached(Budget(iterations=5), Used(iterations=4)) is None
    assert decisions.limit_reached(Budget(iterations=5), Used(iterations=5)) == "budget-iterations"
    assert decisions.limit_reached(Budget(iterations=None, hours=0.5), Used(seconds=1800)) == "budget-hours"
    assert decisions.limit_reached(Budget(iterations=None, tokens=100), Used(tokens_in=60, tokens_out=40)) == "budget-tokens"
    assert decisions.limit_reached(Budget(iterations=None, gpu_seconds=10), Used(gpu_seconds=9.9)) is None


def test_rolling_slots_fill_the_population_within_budget():
    f = decisions.slots_to_fill
    b, u = Budget(iterations=100), Used(iterations=10)
    assert f(b, u, 4, in_flight=0, running=0) == 4
    assert f(b, u, 4, 3, 1) == 3          # one running, two finished waiting: 3 to start
    # behind a slow oldest evaluation (a candidacy's checks) the others go on finishing and starting ...
    assert f(b, u, 4, 8, 4) == 0          # ... the population runs: nothing to start
    assert f(b, u, 4, 8, 1) == 3          # 8 in flight, 1 running: refill to 4 running
    k = decisions.BACKLOG_POPULATIONS
    assert f(b, u, 4, 4 * k - 2, 1) == 2  # ... until the backlog reaches BACKLOG_POPULATIONS x population
    assert f(b, u, 4, 4 * k, 0) == 0
    assert f(b, Used(iterations=98), 4, 1, 1) == 1  # iteration budget counts in-flight
    assert f(b, Used(iterations=100), 4, 0, 0) == 0
    assert f(Budget(iterations=None), u, 4, 2, 2) == 2


def test_budget_changes_below_what_is_used_are_refused():
    used = Used(iterations=7, seconds=7200)
    with pytest.raises(ValueError, match="below the 7 already run"):
        decisions.check_budget_change(Budget(), BudgetChange(iterations=6), used)
    with pytest.raises(ValueError, match="hours 1"):
        decisions.check_budget_change(Budget(), BudgetChange(hours=1), used)
    decisions.check_budget_change(Budget(), BudgetChange(iterations=7), used)
    new = decisions.apply_budget_change(Budget(iterations=30, hours=2), BudgetChange(iterations=50))
    assert new.iterations == 50 and new.hours == 2  # only the fields given change


def test_a_new_best_needs_its_whole_interval_above_the_old_best():
    fast = BenchReport(ok=True, speedup=2.3, speedup_ci=(2.1, 2.5))
    lucky = BenchReport(ok=True, speedup=2.3, speedup_ci=(1.9, 2.7))
    assert decisions.improves_on(fast, _best(2.0))
    assert not decisions.improves_on(lucky, _best(2.0))
    assert not decisions.improves_on(BenchReport(ok=False, speedup=9.0), _best(2.0))
    assert decisions.improves_on(BenchReport(ok=True, speedup=0.1), None)  # the first pass is the first best
    rec = IterationRecord(iteration=3, candidate_id="c", source_key="k", outcome="improved", speedup=2.3,
                          speedup_ci=(1.9, 2.7))
    assert not decisions.improves_on(rec, _best(2.0))


def test_the_head_to_head_with_this_best_decides_not_speedups_from_other_benchmarks():
    # a slower kernel whose baseline happened to time slow shows a higher speedup than the best's; the
    # head-to-head of the same benchmark says it is slower
    best = _best(1.77)
    slower = BenchReport(ok=True, speedup=2.95, speedup_ci=(2.8, 3.1), vs_best_ci=(0.60, 0.66),
                         vs_best=best.candidate_id)
    faster = BenchReport(ok=True, speedup=1.5, speedup_ci=(1.4, 1.6), vs_best_ci=(1.05, 1.12),
                         vs_best=best.candidate_id)
    tie = BenchReport(ok=True, speedup=1.8, speedup_ci=(1.7, 1.9), vs_best_ci=(0.98, 1.04),
                      vs_best=best.candidate_id)
    assert not decisions.improves_on(slower, best)
    assert decisions.improves_on(faster, best)  # faster than the best, whatever the baseline did
    assert not decisions.improves_on(tie, best)
    # measured against another best (it changed meanwhile): the earlier rule, on speedups
    other = BenchReport(ok=True, speedup=2.3, speedup_ci=(2.1, 2.5), vs_best_ci=(0.5, 0.6), vs_best="someone-else")
    assert decisions.improves_on(other, _best(2.0))
    rec = IterationRecord(iteration=3, candidate_id="c", source_key="k", outcome="improved", speedup=2.95,
                          speedup_ci=(2.8, 3.1), vs_best_ci=(0.60, 0.66), vs_best=best.candidate_id)
    assert not decisions.improves_on(rec, best)


def test_leaderboard_keeps_top_k_once_per_candidate():
    board = []
    for i, (cid, s) in enumerate([("a", 1.0), ("b", 3.0), ("c", 2.0), ("a", 4.0), ("d", 0.5)], 1):
        board = decisions.update_leaderboard(board, LeaderEntry(candidate_id=cid, source_key="k", speedup=s,
                                                                 time_ms=1 / s, iteration=i), 3)
    assert [(e.candidate_id, e.speedup) for e in board] == [("a", 4.0), ("b", 3.0), ("c", 2.0)]


def test_under_the_interpreter_the_leaderboard_is_by_time():
    board = []
    for i, (cid, s, ms) in enumerate([("a", 0.002, 90.0), ("b", 0.001, 80.0), ("c", 0.003, 120.0)], 1):
        board = decisions.update_leaderboard(board, LeaderEntry(candidate_id=cid, source_key="k", speedup=s,
                                                                 time_ms=ms, iteration=i), 2, by_time=True)
    assert [e.candidate_id for e in board] == ["b", "a"]


def test_compaction_time_and_trim():
    assert decisions.time_to_compact(10, 10, False) and decisions.time_to_compact(3, 10, True)
    assert not decisions.time_to_compact(9, 10, False)
    long = "x" * 1000
    assert len(decisions.trim(long, 100)) == 100 and decisions.trim(long, 100).endswith("[trimmed]")


def test_default_compaction_interval_and_its_check():
    from workflows.decisions import compaction_problem, default_compact_every

    assert [default_compact_every(p) for p in (1, 2, 24)] == [10, 16, 192]
    assert compaction_problem("search", 24, 24) is None
    assert "carrying the same ones into run after run" in compaction_problem("search", 24, 10)
    assert compaction_problem("llm", 24, 10) is None  # the llm policy runs one turn at a time


def test_a_verdict_brings_the_profile_only_for_a_new_best():
    assert decisions.profile_with_verdict("improved", interpreter=False)
    assert not decisions.profile_with_verdict("passed", interpreter=False)
    assert not decisions.profile_with_verdict("rejected", interpreter=False)
    assert not decisions.profile_with_verdict("improved", interpreter=True)


def test_time_used_leaves_out_the_pauses_the_one_under_way_included():
    assert decisions.seconds_used(1100.0, 1000.0, 30.0, None) == 70.0
    assert decisions.seconds_used(1100.0, 1000.0, 30.0, 1090.0) == 60.0  # a status read while paused
