"""Losers cheap, winners judged on their worst distribution. The distribution where the best's worst speedup
was measured is timed first; a candidate already shown clearly slower than the best there is not timed on
the others (its worst speedup cannot beat the best's). Slower than the best on another distribution decides
nothing: a candidate that trades speed where the best is fast for speed where it is slowest is a new best.
The real benchmark under the interpreter, with a stand-in for each distribution's samples (interpreter
timings could not show a loser reliably on a loaded host)."""

from __future__ import annotations

import hashlib
import random

import pytest

from workflows import decisions
from workflows.contracts import BenchRequest, BestRef


@pytest.fixture
def bench(tmp_path):
    """(run, timed): run(cand_ms, best_ms, deciding) benchmarks the slow canary as the candidate against the
    fast one as the best, each distribution's samples drawn around the given medians (baseline 2.0 ms);
    timed lists the distributions in the order they were timed."""
    from gpu_worker.canaries import canary_source
    from gpu_worker.harness import Evaluator
    from gpu_worker.harness.timed_outputs import TimedDistribution
    from gpu_worker.device.scheduling import Scheduler
    from workflows.artifacts import ArtifactStore

    store = ArtifactStore(tmp_path / "art")
    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    timed: list[str] = []
    medians: dict = {}

    def samples(ms, rng):
        return [ms + rng.gauss(0, 0.01) for _ in range(20)]

    def time_distribution(problem, shape, dist, cand, ref, ref_lock, best, hb, gpu_s, decisive=True):
        timed.append(dist)
        rng = random.Random(dist)
        return TimedDistribution(cand=samples(medians["cand"][dist], rng), base=samples(2.0, rng),
                                 best=samples(medians["best"][dist], rng), cand_host=[1.0], base_host=[2.0],
                                 mode="interpreter", blocks=1, planned_blocks=2, captures={}, noise_seed=1,
                                 check_seed=2)

    e.bench_stage.time_distribution = time_distribution
    e.timed_outputs.check_fingerprints = lambda *a: "stand-in"
    e.timed_outputs.check_timed_outputs = lambda *a: ("stand-in", [])
    src = {n: canary_source(n) for n in ("fast", "slow")}
    keys = {n: store.put_text(s) for n, s in src.items()}
    ids = {n: hashlib.sha256(s.encode()).hexdigest()[:16] for n, s in src.items()}

    def run(cand_ms: dict, best_ms: dict, deciding: str | None):
        medians.update(cand=cand_ms, best=best_ms)
        timed.clear()
        best = BestRef(candidate_id=ids["fast"], source_key=keys["fast"], speedup=2.0 / max(best_ms.values()),
                       time_ms=max(best_ms.values()), baseline_ms=2.0, iteration=1, interpreter=True,
                       deciding_dist=deciding)
        b = e.benchmark(BenchRequest(problem="softmax", candidate_id=ids["slow"], source_key=keys["slow"],
                                     best=best))
        assert b.ok, b.reason
        return b, best, store.get_text(b.log_key)

    yield run, timed
    e.close()


def test_a_clear_loser_is_timed_only_where_the_best_is_slowest(bench):
    run, timed = bench
    best = {"normal": 0.5, "wide": 1.0}  # the best's worst speedup is on wide
    b, ref, log = run({"normal": 0.5, "wide": 1.1}, best, "wide")
    assert timed == ["wide"] and [d.dist for d in b.distributions] == ["wide"]
    assert b.vs_best_ci[1] < 1.0 and not decisions.improves_on(b, ref)
    assert "not timed: normal (already shown slower than the current best)" in log


def test_slower_where_the_best_is_fast_decides_nothing(bench):
    run, timed = bench
    best = {"normal": 0.5, "wide": 1.0}
    # slower than the best on normal, faster on wide, where the best is slowest: every distribution is
    # timed and the worst speedup (2.0 / 0.9 on wide, against the best's 2.0 / 1.0) crowns it
    b, ref, _ = run({"normal": 0.7, "wide": 0.9}, best, "wide")
    assert timed == ["wide", "normal"] and len(b.distributions) == 2
    assert b.deciding_dist == "wide" and b.vs_best_ci[0] > 1.0 and decisions.improves_on(b, ref)


def test_fast_only_where_the_best_is_fast_is_not_crowned(bench):
    run, timed = bench
    best = {"normal": 0.5, "wide": 1.0}
    # faster than the best on normal, level on wide: its worst speedup is no better than the best's
    b, ref, _ = run({"normal": 0.3, "wide": 1.0}, best, "wide")
    assert timed == ["wide", "normal"]
    assert b.vs_best_ci[0] < 1.0 < b.vs_best_ci[1] and not decisions.improves_on(b, ref)


def test_without_the_bests_deciding_distribution_every_one_is_timed(bench):
    run, timed = bench
    b, ref, log = run({"normal": 1.1, "wide": 1.1}, {"normal": 1.0, "wide": 1.0}, None)
    assert timed == ["normal", "wide"] and "not timed" not in log
    assert b.vs_best_ci[1] < 1.0 and not decisions.improves_on(b, ref)
