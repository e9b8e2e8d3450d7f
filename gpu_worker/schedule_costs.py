"""Per-stage costs of a candidate for the schedule's simulator (gpu_worker.schedule_sim): what each stage
does on the host and asks of the device, in order, from the H200 KDA run in docs/results.md (`H200_KDA`,
`h200_table`) or from a GPU worker's phase log (`table_from_activities`, the activity lines that
scripts/phase_summary.py reads).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass

STAGES = ("compile", "verify", "benchmark")


@dataclass(frozen=True)
class StageCost:
    """One stage of one candidate: `host_s` of host work before its first turn, then its `turns` in order,
    each (kind, seconds): "job" an untimed job, "ref" an untimed job with the reference child's lock (the
    harness's _with_ref: the lock first, given back while the turn waits), "block" a timing block (which
    takes the reference child's lock once on the device); each job followed by `gap_s` of host work.
    `mem_gb`: the device memory each of its jobs declares."""

    host_s: float
    turns: tuple[tuple[str, float], ...] = ()
    gap_s: float = 0.0
    mem_gb: float = 0.0

    def steps(self):
        """(kind, seconds) in the order the stage asks for them: "host", "job", "ref", "block"."""
        yield "host", self.host_s
        for kind, s in self.turns:
            yield kind, s
            if kind != "block":
                yield "host", self.gap_s

    @property
    def jobs(self) -> int:
        return sum(k != "block" for k, _ in self.turns)


# One KDA candidate on the H200 (docs/results.md, "Search throughput", past warm-up, per activity), seconds:
# compile 21.8 = 7.9 waiting for a job + 4.4 for a stage retried alone + 0.3 holding its job + 9.2 host
#   (Triton, loading);
# verify 28.1 = 24.2 waiting + 2.0 holding 11 jobs + 1.9 host, spread after the jobs. The jobs as the harness
#   takes them (harness_verify): the cases' upload, six cases, the rerun, the stale probe, the export, the
#   comparison in the reference child; the upload, export and comparison taken as most of the 2.0 s;
# benchmark 33.7 = 20.8 + 3.6 waiting + 1.3 holding ~7.5 jobs + 1.23 timing (36% of 617 s over 181 benchmarks;
#   236 blocks, 1.3 a benchmark: 30% time a second distribution) + 2.8 compiling children before the first
#   job + 4.0 host spread after the jobs. Per distribution (harness_benchmark, harness_timed_outputs): the
#   candidate's and the best's timing sets, the reference child's, the block, the timed outputs' export and
#   their comparison in the reference child.
# What varies: SPREAD, the one figure fitted (so that the owner's predicted rate meets the measured 1,050 an
# hour: tests/gpu_worker/test_schedule_sim.py); RETRY_ALONE, the run's 3 stages retried alone in 543.
_BLOCK = 1.23 / 1.3
_DIST = (("job", 0.25), ("job", 0.25), ("ref", 0.25), ("block", _BLOCK), ("job", 0.1), ("ref", 0.1))
_BENCH = 2.8, 4.0 / 7.5
H200_KDA = {
    "compile": [StageCost(9.2, (("job", 0.3),), mem_gb=0.6)],
    "verify": [StageCost(0.3, (("job", 0.9),) + (("job", 0.05),) * 8 + (("job", 0.35), ("ref", 0.35)), 1.6 / 11,
                         mem_gb=1.9)],
    # one distribution timed 7 times in 10, both 3 times
    "benchmark": [StageCost(_BENCH[0], (("job", 0.1),) + _DIST, _BENCH[1], mem_gb=3.4)] * 7
    + [StageCost(_BENCH[0], (("job", 0.1),) + _DIST * 2, _BENCH[1], mem_gb=3.4)] * 3,
}
SPREAD = 1.25
RETRY_ALONE = 3 / 543


class CostTable:
    """Stage costs to draw from: per stage a list of samples (a log's activities, or a table's), drawn
    uniformly, each job turn and host step of a drawn cost scaled by a mean-one lognormal factor of width
    `spread` (a timing block's length is the harness's plan: as drawn)."""

    def __init__(self, samples: dict[str, list[StageCost]], spread: float = 0.0):
        missing = [s for s in STAGES if not samples.get(s)]
        if missing:
            raise ValueError(f"no costs for the stages {', '.join(missing)}")
        self.samples, self.spread = samples, spread

    def _vary(self, rng: random.Random, s: float) -> float:
        if self.spread <= 0 or s <= 0:
            return s
        return s * math.exp(rng.gauss(0.0, self.spread) - self.spread ** 2 / 2)

    def draw(self, stage: str, rng: random.Random) -> StageCost:
        c = rng.choice(self.samples[stage])
        return StageCost(self._vary(rng, c.host_s),
                         tuple((k, s if k == "block" else self._vary(rng, s)) for k, s in c.turns),
                         self._vary(rng, c.gap_s), c.mem_gb)

    def scaled(self, jobs: float = 1.0) -> "CostTable":
        """A what-if: every job turn `jobs` times as long (host work moved out of the turns, say)."""
        def turns(c: StageCost) -> tuple:
            return tuple((k, s if k == "block" else s * jobs) for k, s in c.turns)

        return CostTable({stage: [StageCost(c.host_s, turns(c), c.gap_s, c.mem_gb) for c in cs]
                          for stage, cs in self.samples.items()}, self.spread)


def h200_table(spread: float = SPREAD) -> CostTable:
    return CostTable(dict(H200_KDA), spread)


#: phases that are waits or turns, not host work: an activity's host time is its seconds less these
_NOT_HOST = ("gpu-job-wait", "gpu-job-held", "gpu-wait", "gpu-held", "stage-wait", "ref-wait")


def _shaped(stage: str, jobs: int | None, blocks: int) -> tuple:
    """H200_KDA's turns for `stage` with `blocks` timing blocks (distributions) and `jobs` jobs (plain ones
    added or taken at the front; None: as they are)."""
    shapes = {sum(k == "block" for k, _ in c.turns): c for c in H200_KDA[stage]}
    base = shapes.get(blocks) or max(shapes.values(), key=lambda c: len(c.turns))
    turns = list(base.turns)
    if blocks and blocks not in shapes:  # more distributions than the table's: one more each
        turns += list(_DIST) * (blocks - max(shapes))
    n = sum(k != "block" for k, _ in turns)
    while jobs is not None and n > jobs and any(k == "job" for k, _ in turns):
        turns.pop(next(i for i, (k, _) in enumerate(turns) if k == "job"))
        n -= 1
    if jobs is not None and n < jobs:
        turns = [("job", 0.0)] * (jobs - n) + turns
    return tuple(turns), base


def table_from_activities(rows: list[dict], spread: float = 0.0) -> CostTable:
    """Stage costs from a GPU worker's activity lines (scripts/phase_summary.py's `activities`), one sample
    per activity: its timing blocks (`gpu-blocks`, sharing `gpu-held`), its job turns (`gpu-jobs` of them
    where counted, sharing `gpu-job-held`), its host time (its seconds less every wait and turn), laid out as
    in H200_KDA (which of its jobs take the reference child's lock, the same share of host work before the
    first turn)."""
    samples: dict[str, list[StageCost]] = defaultdict(list)
    for r in rows:
        stage, ph = r.get("event"), r.get("phases") or {}
        if stage not in STAGES or r.get("seconds") is None:
            continue
        blocks = int(round(ph.get("gpu-blocks", 0)))
        jobs = int(round(ph["gpu-jobs"])) if "gpu-jobs" in ph else None
        turns, base = _shaped(stage, jobs, blocks)
        n = sum(k != "block" for k, _ in turns)
        held, timed = ph.get("gpu-job-held", 0.0), ph.get("gpu-held", 0.0)
        turns = tuple((k, timed / blocks if k == "block" else held / n) for k, _ in turns)
        host = max(0.0, r["seconds"] - sum(ph.get(k, 0.0) for k in _NOT_HOST))
        gaps = base.gap_s * base.jobs
        before = host * base.host_s / (base.host_s + gaps) if base.host_s + gaps else host
        samples[stage].append(StageCost(before, turns, (host - before) / n if n else 0.0, base.mem_gb))
    return CostTable(dict(samples), spread)
