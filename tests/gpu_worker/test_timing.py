"""The device-time judge's decisions (gpu_worker.timing) and its refill-and-check protocol on the CPU
stand-in (the same refill, poison and replayed-output check as on a GPU, without graphs)."""

from __future__ import annotations

import random

import pytest

from gpu_worker import timing
from tests.gpu_worker.harnesses import canary, kernel, req
from workflows.contracts import BenchRequest


def test_mode_is_graph_only_when_every_side_captures():
    assert timing.choose_mode([True, True]) == timing.GRAPH
    assert timing.choose_mode([True, True, True]) == timing.GRAPH
    assert timing.choose_mode([True, False]) == timing.BACK_TO_BACK  # one side that does not: both eager
    assert timing.choose_mode([False, True, True]) == timing.BACK_TO_BACK
    assert timing.choose_mode([]) == timing.BACK_TO_BACK


def _samples(ms: float, n: int = 40, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [ms * (1 + rng.gauss(0, 0.005)) for _ in range(n)]


def _fig(dist, cand_ms, base_ms, best_ms=None, cand_host=None, base_host=None):
    return timing.distribution_figures(dist, _samples(cand_ms, seed=1), _samples(base_ms, seed=2),
                                       _samples(best_ms, seed=3) if best_ms else None,
                                       cand_host or [cand_ms], base_host or [base_ms])


def test_the_worst_distribution_decides():
    # fast on easy inputs, slow on hard ones: the hard one decides, the geometric mean is beside it
    mild, strong = _fig("mild", 0.5, 1.0), _fig("strong", 3.4, 1.0)
    v = timing.decide([mild, strong])
    assert v.worst.dist == "strong"
    assert v.speedup == pytest.approx(1.0 / 3.4, rel=0.02)
    assert v.geomean_speedup == pytest.approx((2.0 / 3.4) ** 0.5, rel=0.02)
    # the interval is the conservative one for a minimum: no distribution's interval is above it
    assert v.speedup_ci[0] <= min(mild.speedup_ci[0], strong.speedup_ci[0])
    assert v.speedup_ci[1] <= strong.speedup_ci[1] < mild.speedup_ci[0]
    with pytest.raises(ValueError):
        timing.decide([])


def test_head_to_head_with_the_best_compares_worst_speedups():
    # faster than the best on one distribution, slower on the other where it is then slowest: not above 1
    a, b = _fig("unit", 0.9, 1.0, best_ms=1.0), _fig("peaked", 1.1, 1.0, best_ms=1.0)
    assert timing.decide([a, b]).vs_best_ci[1] < 1.0
    assert timing.decide([a, _fig("peaked", 1.1, 1.0)]).vs_best_ci is None  # no best on one of them
    # slower than the best where the best is fast (mild), faster where the best is slowest (strong): the
    # candidate's worst speedup 1/0.9 beats the best's 1/1.0, so the interval lies above 1
    mild, strong = _fig("mild", 0.6, 1.0, best_ms=0.5), _fig("strong", 0.9, 1.0, best_ms=1.0)
    lo, hi = timing.decide([mild, strong]).vs_best_ci
    assert 1.0 < lo and hi < 1.2 and lo < 1.0 / 0.9 < hi
    # fast only where the best is fast: its worst speedup is the best's, the interval straddles 1
    mild, strong = _fig("mild", 0.3, 1.0, best_ms=0.5), _fig("strong", 1.0, 1.0, best_ms=1.0)
    lo, hi = timing.decide([mild, strong]).vs_best_ci
    assert lo < 1.0 < hi


def test_one_distributions_head_to_head_is_best_over_candidate():
    f = _fig("normal", 0.8, 1.0, best_ms=1.0)
    lo, hi = timing.worst_speedup_ratio_ci([f])
    assert lo < 1.0 / 0.8 < hi and lo == pytest.approx(f.vs_best_ci[0], rel=0.02)


def test_the_decisive_distribution_is_where_the_best_is_slowest():
    assert timing.decisive_dist(["mild", "strong"], "strong") == "strong"
    assert timing.decisive_dist(["mild", "strong"], None) is None  # unknown: every distribution in full
    assert timing.decisive_dist(["mild", "strong"], "gone") is None
    assert timing.decisive_dist(["normal"], None) == "normal"


def test_host_latency_is_its_own_figure_never_in_the_speedup():
    # same device time, one side with 300 us more host work per call: speedup 1, host figures apart
    f = _fig("normal", 0.05, 0.05, cand_host=[0.35] * 5, base_host=[0.05] * 5)
    assert f.speedup == pytest.approx(1.0, rel=0.01)
    assert f.host_ms == pytest.approx(0.35) and f.baseline_host_ms == pytest.approx(0.05)


def test_crosscheck_allows_five_percent_or_three_microseconds_and_each_launchs_dispatch():
    assert timing.crosscheck(1.0, 1.045)[0] and timing.crosscheck(1.0, 0.955)[0]
    assert not timing.crosscheck(1.0, 1.06)[0] and not timing.crosscheck(1.0, 0.94)[0]
    ok, allowed = timing.crosscheck(0.0172, 0.0150)  # a 17 us kernel: the absolute allowance applies
    assert ok and allowed == pytest.approx(0.003 + 0.001)
    assert timing.crosscheck(0.030, 0.020, launches=8)[0]  # eight dispatches in the judged interval
    assert not timing.crosscheck(0.030, 0.020, launches=2)[0]
    assert not timing.crosscheck(0.0172, 0.0100)[0]
    assert not timing.crosscheck(0.100, 0.0156)[0]  # events five times the kernel time: work not seen


def test_the_judge_may_read_a_short_kernel_low_by_the_refill_s_cost_and_never_high():
    # decode Q1 on the H200: check 16.1 us, torch-bmm 22.9 us (1.42x); the judge 1.35x: within the refill's
    # 1.7 us, as its -5% to -6.5% figures are
    ok, low, high = timing.agreement(1.35, 22.9 / 16.1, 0.0161)
    assert ok and low == pytest.approx(22.9 / (16.1 + 1.7), rel=1e-6) and high == pytest.approx(1.02 * 22.9 / 16.1)
    assert not timing.agreement(1.28, 22.9 / 16.1, 0.0161)[0]  # lower than the refill can make it
    assert not timing.agreement(1.46, 22.9 / 16.1, 0.0161)[0]  # higher by more than 2%: never
    assert timing.agreement(1.44, 22.9 / 16.1, 0.0161)[0]
    # a longer kernel: the figures' tolerance below, 2% above
    assert timing.agreement(1.04, 1.07, 0.9, tolerance=0.03)[0]
    assert not timing.agreement(1.03, 1.07, 0.9, tolerance=0.03)[0]
    assert not timing.agreement(1.10, 1.07, 0.9, tolerance=0.03)[0]


def test_cushion_covers_the_host_queueing_a_block():
    assert timing.cushion_ms(0.3, 20) >= 0.3 * 20
    assert timing.cushion_ms(0.0, 20) > 0
    assert timing.cushion_ms(100.0, 100) == 400.0  # capped: blocks are short
    # a device at least as slow per repetition as the host: the host need only be ahead by one
    assert timing.cushion_ms(0.3, 20, device_floor_ms=0.45) == pytest.approx(1.5 * 0.3 + 1.0)
    # a faster device: the host loses (1.5 h - floor) on each later repetition, which the wait covers
    assert timing.cushion_ms(0.3, 20, device_floor_ms=0.2) == pytest.approx(0.45 + 19 * 0.25 + 1.0)
    assert timing.cushion_ms(0.3, 20, device_floor_ms=0.0) == timing.cushion_ms(0.3, 20)


def test_cushion_keeps_every_repetition_queued_before_the_device_reaches_it():
    # host queues repetition i by (i + 1) h; the device reaches it at cushion + i d, for d >= the floor
    for h, d, reps in [(0.3, 0.1, 20), (1.2, 1.0, 20), (0.05, 2.0, 5), (0.8, 0.0, 10), (2.0, 1.9, 100)]:
        c = timing.cushion_ms(h, reps, device_floor_ms=d, cap_ms=1e9)
        assert all(c + i * d >= (i + 1) * h for i in range(reps)), (h, d, reps)


def test_timing_canary_checks():
    assert timing.canary_host_work({"time_ms": 0.0505}, {"time_ms": 0.050})[0]
    assert not timing.canary_host_work({"time_ms": 0.35}, {"time_ms": 0.050})[0]  # host work counted
    one = {"time_ms": 0.040, "kernel_ms": 0.039}
    assert timing.canary_launch_count(one, {"time_ms": 0.046, "kernel_ms": 0.044}, 7)[0]
    # eight launches judged 60 us slower while their kernels add 5 us: launch latency was counted
    assert not timing.canary_launch_count(one, {"time_ms": 0.100, "kernel_ms": 0.044}, 7)[0]


def test_clearly_slower_needs_samples_and_a_whole_interval_below_one():
    rng = random.Random(0)
    best = [1.0 + rng.gauss(0, 0.01) for _ in range(40)]
    slow = [1.1 + rng.gauss(0, 0.01) for _ in range(40)]
    same = [1.0 + rng.gauss(0, 0.01) for _ in range(40)]
    fast = [0.9 + rng.gauss(0, 0.01) for _ in range(40)]
    assert timing.clearly_slower(best, slow)
    assert not timing.clearly_slower(best, same) and not timing.clearly_slower(best, fast)
    assert timing.clearly_slower(best[:20], slow[:20])  # one CUDA block (20 repetitions) decides
    assert not timing.clearly_slower(best[:10], slow[:10])  # too few samples to decide
    assert not timing.clearly_slower([], slow)  # no best: nothing to compare with


def test_a_clear_loser_is_timed_for_one_block_and_one_distribution():
    rng = random.Random(1)
    best = [1.0 + rng.gauss(0, 0.01) for _ in range(20)]
    slow = [1.1 + rng.gauss(0, 0.01) for _ in range(20)]
    close = [1.002 + rng.gauss(0, 0.01) for _ in range(20)]
    assert timing.another_block(0, [], [])  # the first block always
    assert timing.another_block(0, best, slow)
    assert not timing.another_block(1, best, slow)  # after one block of 20 the loser stops
    assert timing.another_block(1, best, close)  # not decided: timed on
    assert timing.another_block(1, [], slow)  # no best: every block
    fig = timing.distribution_figures("normal", slow, best, best, [], [])
    assert timing.shown_slower(fig)  # the other distributions are not timed
    assert not timing.shown_slower(timing.distribution_figures("normal", close, best, best, [], []))
    assert not timing.shown_slower(timing.distribution_figures("normal", slow, best, None, [], []))
    # on a distribution where the best is not at its slowest, slower than the best decides nothing
    assert timing.another_block(1, best, slow, decisive=False) and not timing.shown_slower(fig, decisive=False)


# --- the protocol on the CPU stand-in ---------------------------------------------------------------

def test_every_distribution_is_timed_and_reported(ev, store):
    r = req(store, canary("fast"))
    b = ev.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))
    assert b.ok, b.reason
    assert [d.dist for d in b.distributions] == ["normal", "wide"]
    worst = min(b.distributions, key=lambda d: d.speedup)
    assert b.deciding_dist == worst.dist and b.speedup == worst.speedup and b.time_ms == worst.time_ms
    assert b.host_ms == worst.host_ms and b.host_ms is not None and b.baseline_host_ms is not None
    assert b.geomean_speedup is not None and all(d.mode == "interpreter" for d in b.distributions)


def test_a_result_from_an_earlier_call_on_the_same_buffers_is_rejected(judge, store):
    """Every refill gives a buffer other values than it held: a candidate handing back what it computed on
    that buffer before (a per-buffer cache, a graph replaying a result fixed at capture) is caught by the
    check of a timed repetition's outputs against the baseline's on that repetition's values."""
    r = req(store, kernel("lagged_output"))
    assert judge.compile(r).ok
    assert judge.verify(r).ok  # right while verified
    b = judge.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key))
    assert not b.ok and b.stage == "benchmark", b
    assert b.reason.startswith("timed-output"), b.reason


def test_cold_means_the_same_to_the_harness_and_to_the_independent_measurement(monkeypatch):
    """The harness's L2 flush and devicetime's rotated copies read the same amount between two uses of an
    input: twice L2, at least 256 MiB."""
    from gpu_worker import devicetime

    monkeypatch.setattr(devicetime, "l2_bytes", lambda: 50 << 20)
    assert devicetime.cold_bytes() == 256 << 20
    monkeypatch.setattr(devicetime, "l2_bytes", lambda: 200 << 20)
    assert devicetime.cold_bytes() == 400 << 20
    import torch

    sets = devicetime.rotated_copies(lambda i: {"x": torch.empty(100 << 20, dtype=torch.uint8)})
    assert len(sets) == 4  # 4 x 100 MiB hold 400 MiB
