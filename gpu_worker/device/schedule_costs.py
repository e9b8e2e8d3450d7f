"""Per-stage costs of a candidate for the schedule's simulator (gpu_worker.device.schedule_sim): what each stage
does on the host and asks of the device, in order, as the harness asks for it now (`PRESENT`) or as it did
when the H200 KDA run of docs/results.md was recorded (`RECORDED`), with that run's figures
(`h200_table`), or from a GPU worker's phase log (`table_from_activities`, the activity lines that
scripts/phase_summary.py reads), laid out as the present harness asks for them.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace

STAGES = ("compile", "verify", "benchmark")
ENGINES = ("present", "recorded")

#: what one turn's request costs inside the turn beyond the child's own steps: a round trip with the child
#: (a no-op request to a sandbox child: 1.05 ms median on the CPU VM; a log's verify rows give their own,
#: `turn_overhead`). Merging n turns into one saves n - 1 of it.
TURN_S = 0.001


def seconds(s: float | tuple) -> float:
    """A turn's seconds: a merged turn's (a tuple of its parts') summed."""
    return sum(s) if isinstance(s, tuple) else s


@dataclass(frozen=True)
class StageCost:
    """One stage of one candidate: `before`, steps outside the stage gate ((kind, seconds): "host" or "job";
    loading a child); then, inside the gate, `host_s` of host work before its first turn, then its `turns`
    in order, each (kind, seconds): "job" an untimed job (its seconds a tuple where it merges several: the
    parts, each varied on its own when drawn), "ref" an untimed job with the reference child's
    lock (the harness's DeviceTurns.with_ref: the lock first, given back while the turn waits), "block" a timing block
    (which takes the reference child's lock once on the device); each job followed by `gap_s` of host
    work. `mem_gb`: the device memory each of its jobs declares."""

    host_s: float
    turns: tuple[tuple[str, float], ...] = ()
    gap_s: float = 0.0
    mem_gb: float = 0.0
    before: tuple[tuple[str, float], ...] = ()

    def steps(self):
        """(kind, seconds) inside the gate, in the order the stage asks for them: "host", "job", "ref",
        "block"."""
        yield "host", self.host_s
        for kind, s in self.turns:
            yield kind, seconds(s)
            if kind != "block":
                yield "host", self.gap_s

    @property
    def jobs(self) -> int:
        """Untimed job turns, those before the gate included."""
        return sum(k != "block" for k, _ in self.turns) + sum(k == "job" for k, _ in self.before)

    @property
    def host(self) -> float:
        return self.host_s + self.gap_s * sum(k != "block" for k, _ in self.turns) + \
            sum(s for k, s in self.before if k == "host")


# One KDA candidate on the H200 (docs/results.md, "Search throughput", past warm-up, per activity), seconds:
# compile 21.8 = 7.9 waiting for a job + 4.4 for a stage retried alone + 0.3 holding its jobs + 9.2 host,
#   split as the whole run's 4.6 loading (before the stage gate: a spare's CUDA context asked again, a no-op
#   job, then the load) and 8.5 Triton (in the gate, after the case's upload job);
# verify 28.1 = 24.2 waiting + 2.0 holding 11 jobs + 1.9 host, spread after the jobs. The jobs as the harness
#   took them then: the cases' upload, six cases, the rerun, the stale probe, the export, the comparison in
#   the reference child; the upload, export and comparison taken as most of the 2.0 s;
# benchmark 33.7 = 20.8 + 3.6 waiting + 1.3 holding ~7.5 jobs + 1.23 timing (36% of 617 s over 181 benchmarks;
#   236 blocks, 1.3 a benchmark: 30% time a second distribution) + 2.8 compiling children before the first
#   job + 4.0 host spread after the jobs. Per distribution: the candidate's and the best's timing sets, the
#   reference child's, the block, then the timed outputs' export (a job then) and their comparison in the
#   reference child.
# What varies: SPREAD, the one figure fitted (so that the owner's predicted rate under RECORDED meets the
# measured 1,050 an hour: tests/gpu_worker/test_schedule_sim.py); RETRY_ALONE, the run's 3 stages retried
# alone in 543, at one memory peak (RETRY_BURST).
RECORDED_BLOCK = 1.23 / 1.3
_LOAD = (("job", TURN_S), ("host", 9.2 * 4.6 / 13.1))
_COMPILE = StageCost(0.0, (("job", 0.3),), 9.2 * 8.5 / 13.1, mem_gb=0.6, before=_LOAD)
_VERIFY_JOBS = (("job", 0.9),) + (("job", 0.05),) * 8 + (("job", 0.35),)  # upload, 8 calls, export
_DIST_RECORDED = (("job", 0.25), ("job", 0.25), ("ref", 0.25), ("block", RECORDED_BLOCK), ("job", 0.1), ("ref", 0.1))
#: a block's length now that each refill is one kernel pass per input (baselines.perturb_kernels): KDA's
#: starting kernel's timing window, 2.03 s against 3.53 s before, on one H100 (docs/results.md, "Shorter
#: timing blocks"; no H200 was lent to measure it)
ONE_PASS_REFILL = 2.026 / 3.525
# present: the export's download in the block (the host latency's request), no job of its own
_DIST = (("job", 0.25), ("job", 0.25), ("ref", 0.25), ("block", RECORDED_BLOCK * ONE_PASS_REFILL + 0.1 - TURN_S),
         ("ref", 0.1))


def _benchmarks(dist: tuple) -> list[StageCost]:
    """One distribution timed 7 times in 10, both 3 times; the recorded 4.0 s of host work after the first
    turn spread over the jobs (their mean count)."""
    one, two = (("job", 0.1),) + dist, (("job", 0.1),) + dist * 2
    jobs = 0.7 * sum(k != "block" for k, _ in one) + 0.3 * sum(k != "block" for k, _ in two)
    return [StageCost(2.8, one, 4.0 / jobs, mem_gb=3.4)] * 7 + [StageCost(2.8, two, 4.0 / jobs, mem_gb=3.4)] * 3


#: the harness when the run was recorded: verification 11 jobs, each distribution's timed outputs exported in
#: a job of their own
RECORDED = {
    "compile": [_COMPILE],
    "verify": [StageCost(0.3, _VERIFY_JOBS + (("ref", 0.35),), 1.6 / 11, mem_gb=1.9)],
    "benchmark": _benchmarks(_DIST_RECORDED),
}
#: the harness now (harness_verify, harness_benchmark): verification one job of the candidate's child (the
#: recorded ten's seconds less nine turns' overhead) and the comparison; the timed outputs downloaded in the
#: distribution's timing block (the recorded export job's seconds less its turn's overhead added to it), the
#: block's recorded timing at ONE_PASS_REFILL of its length
PRESENT = {
    "compile": [_COMPILE],
    "verify": [StageCost(0.3, (("job", tuple(s for _, s in _VERIFY_JOBS) + (-9 * TURN_S,)), ("ref", 0.35)),
                         1.6 / 2, mem_gb=1.9)],
    "benchmark": _benchmarks(_DIST),
}
SPREAD = 1.5
RETRY_ALONE = 3 / 543
RETRY_BURST = 3


class CostTable:
    """Stage costs to draw from: per stage a list of samples (a log's activities, or a table's), drawn
    uniformly, each job turn and host step of a drawn cost scaled by a mean-one lognormal factor of width
    `spread` (a timing block's length is the harness's plan: as drawn)."""

    def __init__(self, samples: dict[str, list[StageCost]], spread: float = 0.0):
        missing = [s for s in STAGES if not samples.get(s)]
        if missing:
            raise ValueError(f"no costs for the stages {', '.join(missing)}")
        self.samples, self.spread = samples, spread

    def _vary(self, rng: random.Random, s: float | tuple) -> float:
        if isinstance(s, tuple):  # a merged turn: its parts varied one by one
            return sum(self._vary(rng, x) for x in s) if self.spread > 0 else sum(s)
        if self.spread <= 0 or s <= 0:
            return s
        return s * math.exp(rng.gauss(0.0, self.spread) - self.spread ** 2 / 2)

    def _steps(self, rng: random.Random, steps: tuple) -> tuple:
        return tuple((k, s if k == "block" else self._vary(rng, s)) for k, s in steps)

    def draw(self, stage: str, rng: random.Random) -> StageCost:
        c = rng.choice(self.samples[stage])
        return StageCost(self._vary(rng, c.host_s), self._steps(rng, c.turns), self._vary(rng, c.gap_s), c.mem_gb,
                         self._steps(rng, c.before))

    def scaled(self, jobs: float = 1.0, blocks: float = 1.0) -> "CostTable":
        """A what-if: every job turn `jobs` times as long (host work moved out of the turns, say), every
        timing block `blocks` times."""
        def turns(steps: tuple) -> tuple:
            return tuple((k, seconds(s) * jobs if k in ("job", "ref") else s * blocks if k == "block" else s)
                         for k, s in steps)

        return CostTable({stage: [replace(c, turns=turns(c.turns), before=turns(c.before)) for c in cs]
                          for stage, cs in self.samples.items()}, self.spread)


def h200_table(spread: float = SPREAD, engine: str = "present") -> CostTable:
    """The H200 KDA run's costs, laid out as the harness asks for them now or as it did then."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
    return CostTable(dict(PRESENT if engine == "present" else RECORDED), spread)


# --- a phase log's costs ------------------------------------------------------------------------------------
#: phases that are waits or turns, not host work: an activity's host time is its seconds less these
_NOT_HOST = ("gpu-job-wait", "gpu-job-held", "gpu-wait", "gpu-held", "stage-wait", "ref-wait")


def _recorded(phases: dict) -> bool:
    """Whether an activity was logged by the recorded harness: it downloaded outputs in jobs of their own,
    under the phase "export" (verification's, each distribution's timed outputs')."""
    return "export" in phases


def turn_overhead(rows: list[dict]) -> float:
    """Seconds a turn's request costs inside the turn, as a log shows it: per verify activity, its phase
    "run-cases" (the turns' requests, timed inside the turns) less the child's own seconds for those steps
    ("run-cases.*"), over the requests it made (the recorded harness: one per case, the rerun and the stale
    probe, the jobs less three; the present: one); the median. TURN_S where no activity shows it."""
    per = []
    for r in rows:
        ph = r.get("phases") or {}
        own = [v for k, v in ph.items() if k.startswith("run-cases.")]
        if r.get("event") != "verify" or "run-cases" not in ph or not own:
            continue
        requests = (int(round(ph["gpu-jobs"])) - 3 if "gpu-jobs" in ph else 8) if _recorded(ph) else 1
        per.append(max(0.0, (ph["run-cases"] - sum(own)) / max(1, requests)))
    return statistics.median(per) if per else TURN_S


def _shaped(layout: dict, stage: str, jobs: int | None, blocks: int) -> tuple[StageCost, tuple]:
    """`layout`'s cost for `stage` with `blocks` timing blocks (distributions) and `jobs` jobs (plain ones
    added or taken at the front, the mean job's seconds each; None: as they are). Returns the base cost and
    its turns."""
    shapes = {sum(k == "block" for k, _ in c.turns): c for c in layout[stage]}
    base = shapes.get(blocks) or max(shapes.values(), key=lambda c: len(c.turns))
    turns = list(base.turns)
    if blocks and blocks not in shapes:  # more distributions than the table's: one more each
        dist = _DIST_RECORDED if layout is RECORDED else _DIST
        turns += list(dist) * (blocks - max(shapes))
    mean = sum(seconds(s) for k, s in turns if k != "block") / max(1, sum(k != "block" for k, _ in turns))
    n = base.jobs - len(base.turns) + len(turns)  # the before-gate jobs stay
    while jobs is not None and n > jobs and any(k == "job" for k, _ in turns):
        turns.pop(next(i for i, (k, _) in enumerate(turns) if k == "job"))
        n -= 1
    if jobs is not None and n < jobs:
        turns = [("job", mean)] * (jobs - n) + turns
    return base, tuple(turns)


def _spread_held(turns: tuple, before: tuple, held: float, timed: float) -> tuple[tuple, tuple]:
    """A log's held seconds over the job turns (in and before the gate) in the proportions of the table's
    seconds for them, its timed seconds over the blocks equally."""
    jobs = [seconds(s) for k, s in before + turns if k != "block" and k != "host"]
    total = sum(jobs) or 1.0
    blocks = sum(k == "block" for k, _ in turns)

    def share(k: str, s: float) -> float:
        if k == "host":
            return s
        return timed / blocks if k == "block" else held * seconds(s) / total

    return tuple((k, share(k, s)) for k, s in turns), tuple((k, share(k, s)) for k, s in before)


def as_present(stage: str, turns: tuple, per_turn: float) -> tuple:
    """A recorded activity's turns as the present harness asks for them: verification's jobs of the
    candidate's child merged into one (their seconds less the merged turns' overhead), each timed outputs'
    export job folded into the timing block before it (its seconds less its turn's overhead)."""
    if stage == "verify":
        own = [s for k, s in turns if k == "job"]
        if len(own) < 2:
            return turns
        merged = ("job", max(0.0, sum(own) - (len(own) - 1) * per_turn))
        return (merged,) + tuple(t for t in turns if t[0] != "job")
    if stage == "benchmark":
        out: list = []
        for k, s in turns:
            if k == "job" and out and out[-1][0] == "block":
                out[-1] = ("block", out[-1][1] + max(0.0, s - per_turn))
            else:
                out.append((k, s))
        return tuple(out)
    return turns


def table_from_activities(rows: list[dict], spread: float = 0.0, engine: str = "present") -> CostTable:
    """Stage costs from a GPU worker's activity lines (scripts/phase_summary.py's `activities`), one sample
    per activity: its timing blocks (`gpu-blocks`, sharing `gpu-held`), its job turns (`gpu-jobs` of them
    where counted, sharing `gpu-job-held` in the table's proportions), its host time (its seconds less every
    wait and turn, split as the table splits it), laid out as its own harness asked for them (RECORDED
    where it exported outputs in jobs of their own, else PRESENT) and then, for `engine` "present", as the
    present harness asks (`as_present`, with the log's own `turn_overhead`)."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
    per_turn = turn_overhead(rows)
    samples: dict[str, list[StageCost]] = defaultdict(list)
    for r in rows:
        stage, ph = r.get("event"), r.get("phases") or {}
        if stage not in STAGES or r.get("seconds") is None:
            continue
        recorded = _recorded(ph)
        layout = RECORDED if recorded else PRESENT
        blocks = int(round(ph.get("gpu-blocks", 0)))
        jobs = int(round(ph["gpu-jobs"])) if "gpu-jobs" in ph else None
        base, turns = _shaped(layout, stage, jobs, blocks)
        turns, before = _spread_held(turns, base.before, ph.get("gpu-job-held", 0.0), ph.get("gpu-held", 0.0))
        if recorded and engine == "present":
            turns = as_present(stage, turns, per_turn)
        host = max(0.0, r["seconds"] - sum(ph.get(k, 0.0) for k in _NOT_HOST))
        scale = host / base.host if base.host else 0.0
        before = tuple((k, s * scale if k == "host" else s) for k, s in before)
        n = sum(k != "block" for k, _ in turns)
        inside = max(0.0, host - sum(s for k, s in before if k == "host"))  # in the gate: before and after turns
        first = min(inside, base.host_s * scale) if n else inside
        samples[stage].append(StageCost(first, turns, (inside - first) / n if n else 0.0, base.mem_gb, before))
    return CostTable(dict(samples), spread)
