"""A candidate that one distribution's timing already shows clearly slower than the current best is not timed
on the others (it cannot be accepted: acceptance needs every distribution); one level with the best is timed
on every distribution. The real benchmark under the interpreter, with a stand-in for each distribution's
samples (interpreter timings could not show a loser reliably on a loaded host)."""

from __future__ import annotations

import hashlib
import random

from workflows.contracts import BenchRequest, BestRef


def test_a_clear_loser_is_timed_on_one_distribution_a_close_one_on_all(tmp_path):
    from gpu_worker.canaries import canary_source
    from gpu_worker.harness import Evaluator
    from gpu_worker.scheduling import Scheduler
    from workflows.artifacts import ArtifactStore

    store = ArtifactStore(tmp_path / "art")
    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    timed: list[str] = []
    cand_ms = [1.1]

    def samples(ms, rng):
        return [ms + rng.gauss(0, 0.01) for _ in range(20)]

    def time_distribution(problem, shape, dist, cand, ref, ref_lock, best, hb, gpu_s):
        timed.append(dist)
        rng = random.Random(dist)
        return {"cand": samples(cand_ms[0], rng), "base": samples(2.0, rng), "best": samples(1.0, rng),
                "cand_host": [1.0], "base_host": [2.0], "mode": "interpreter", "blocks": 1, "planned_blocks": 2,
                "captures": {}, "noise_seed": 1}

    e._time_distribution = time_distribution
    e._check_fingerprints = lambda *a: "stand-in"
    e._check_timed_outputs = lambda *a: ("stand-in", [])
    try:
        src = {n: canary_source(n) for n in ("fast", "slow")}
        keys = {n: store.put_text(s) for n, s in src.items()}
        ids = {n: hashlib.sha256(s.encode()).hexdigest()[:16] for n, s in src.items()}
        best = BestRef(candidate_id=ids["fast"], source_key=keys["fast"], speedup=2.0, time_ms=1.0,
                       baseline_ms=2.0, iteration=1, interpreter=True)
        req = BenchRequest(problem="softmax", candidate_id=ids["slow"], source_key=keys["slow"], best=best)

        b = e.benchmark(req)
        assert b.ok, b.reason
        assert timed == ["normal"] and [d.dist for d in b.distributions] == ["normal"]
        assert b.vs_best_ci[1] < 1.0
        assert "not timed: wide (already shown slower than the current best)" in store.get_text(b.log_key)

        timed.clear()
        cand_ms[0] = 1.0  # level with the best: every distribution, for the acceptance's interval
        b = e.benchmark(req)
        assert b.ok, b.reason
        assert timed == ["normal", "wide"] and len(b.distributions) == 2
        assert "not timed" not in store.get_text(b.log_key)
    finally:
        e.close()
