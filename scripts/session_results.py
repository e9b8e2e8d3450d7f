"""What a run of scripts/gpu_session.py did, from its ledger and the samples taken while it ran: evaluations per
hour and GPU use per window of fixed GPU workers, how long each verdict took, and which of its kernels --bench
measures.

    python scripts/session_results.py --verdicts STATUS.json   # a run's verdict waits (`marathon status --json`)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path


def run_records(st: dict) -> list:
    """The run's records from its ledger (status's ledger_key); none before its first."""
    from workflows.artifacts import ArtifactStore
    from activities.ledger import read_ledger

    return read_ledger(ArtifactStore(), st["ledger_key"]) if st.get("ledger_key") else []


def best_source_key(st: dict, recs: list) -> str | None:
    """The source key of the run's crowned best (status `st`), from its records (`run_records`)."""
    b = st.get("best")
    if not b:
        return None
    return next((r.source_key for r in recs if r.candidate_id == b["candidate_id"]), None)


def fastest_passing_source_keys(records: list, n: int = 3) -> list[str]:
    """Source keys of the n fastest candidates that passed (verified and benchmarked: outcome improved or
    passed), by their benchmark time in the run, each once."""
    passing = sorted((r for r in records if r.outcome in ("improved", "passed") and r.time_ms is not None),
                     key=lambda r: r.time_ms)
    return list(dict.fromkeys(r.source_key for r in passing))[:n]


def bench_source_keys(st: dict, recs: list, fastest: int = 3) -> list[str]:
    """What --bench measures of a run: its crowned best, then its fastest passing candidates. The crown is not
    always the fastest kernel (an older acceptance rule crowned slower ones, and in-run times are noisy), so
    the scoreboard measures them side by side. From the run's ledger, which holds every record once the run
    has ended (its last compaction); a run left going (--keep-running) lacks those since its last compaction."""
    return list(dict.fromkeys(k for k in [best_source_key(st, recs), *fastest_passing_source_keys(recs, fastest)]
                              if k))


def throughput(recs: list, workers: list[dict], t_start: float, samples: list[dict], problem: str = "", *,
               smi: list, cpu: list) -> dict:
    """Evaluations per hour and GPU busy fraction per window with a fixed number of GPU workers, from the
    run's records (`run_records`). Busy: the increase of each worker's marathon_gpu_busy_seconds_total
    between the window's first and last sample over the time between them. The ledger holds a run's records
    up to its last compaction only, so a run left going (--keep-running) also gets `recorded`: the increase
    of its recorded iterations (`marathon status`, sampled every 10 s) over the window, and its rate. `smi` and
    `cpu`: the nvidia-smi and CPU rows sampled meanwhile (session_samples.SMI and CPU)."""
    ends = sorted(r.finished_at for r in recs if r.finished_at)
    lo0 = max(t_start, workers[0]["since"])
    # the ledger is written as iterations are recorded; one with nothing newer than this session's start
    # (a resumed run whose records are still in flight) gets the session's span, not a negative one
    bounds = [lo0] + [w["since"] for w in workers[1:]] + [ends[-1] if ends and ends[-1] > lo0 else time.time()]
    out = []
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        n = sum(lo <= t < hi for t in ends)
        busy, timed, closed, util, mem, clk = {}, {}, {}, {}, {}, {}
        for w in workers[:i + 1]:
            gpu = int(w["name"][3:])
            rows = [(u, m, c) for t, g, u, m, c in smi if g == gpu and lo <= t <= hi]
            if rows:
                util[w["name"]] = round(sum(r[0] for r in rows) / len(rows) / 100, 3)
                mem[w["name"]] = max(r[1] for r in rows)
                clk[w["name"]] = round(sum(r[2] for r in rows) / len(rows))
            for key, into in (("busy", busy), ("timed", timed), ("closed", closed)):
                pts = [(x["t"], x.get(key, {}).get(w["name"])) for x in samples
                       if lo <= x["t"] <= hi and x.get(key, {}).get(w["name"]) is not None]
                if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
                    into[w["name"]] = round((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]), 3)
        its = [(x["t"], x["runs"][problem]["iteration"]) for x in samples if lo <= x["t"] <= hi
               and isinstance(x.get("runs", {}).get(problem, {}).get("iteration"), int)]
        recorded = its[-1][1] - its[0][1] if len(its) >= 2 else None
        cpus = [c for c in cpu if lo <= c[0] <= hi]
        out.append({"gpus": i + 1, "from_s": round(lo - t_start, 1), "to_s": round(hi - t_start, 1),
                    "evaluations": n, "per_hour": round(n / max(hi - lo, 1e-9) * 3600, 1),
                    "recorded": recorded, "recorded_per_hour": round(recorded / (its[-1][0] - its[0][0]) * 3600, 1)
                    if recorded is not None and its[-1][0] > its[0][0] else None,
                    "busy_fraction": busy, "timed_fraction": timed, "closed_fraction": closed,
                    "smi_utilization": util, "smi_max_memory_mib": mem, "smi_mean_sm_mhz": clk,
                    "cpu_busy": round(sum(c[1] for c in cpus) / len(cpus), 3) if cpus else None})
    outcomes = Counter(r.outcome if r.outcome != "rejected" else f"rejected:{r.stage}" for r in recs)
    return {"windows": out, "evaluations": len(recs), "outcomes": dict(outcomes)}


def verdict_waits(recs: list) -> dict:
    """How long each verdict took from its submission (the evaluation's start) to its record: the run records
    in iteration order, so an iteration is recorded once it and every one before it have ended. Per kind
    (`loser`: passed or rejected; `best`: improved), seconds: median, 90th percentile, max, and the median
    of the part held behind the run's order: from its own stages' answer (`judged_at`: a would-be best then
    waits for the run's answer to its candidacy; records without it, from before it was kept, count from
    their end) to its record. From the run's records (`run_records`); the run's own step after the last end
    is not counted."""
    out, recorded = {}, 0.0
    rows = []
    for r in sorted(recs, key=lambda r: r.iteration):
        if not (r.started_at and r.finished_at):
            continue
        recorded = max(recorded, r.finished_at)
        rows.append(("best" if r.outcome == "improved" else "loser", recorded - r.started_at,
                     recorded - (r.judged_at or r.finished_at)))
    for kind in ("loser", "best"):
        waits = sorted(w for k, w, _ in rows if k == kind)
        if waits:
            out[kind] = {"n": len(waits), "median_s": round(statistics.median(waits), 2),
                         "p90_s": round(waits[min(len(waits) - 1, int(0.9 * len(waits)))], 2),
                         "max_s": round(waits[-1], 2),
                         "held_median_s": round(statistics.median(h for k, _, h in rows if k == kind), 2)}
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--verdicts":
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    st = json.loads(Path(argv[1]).read_text())
    print(json.dumps(verdict_waits(run_records(st)), indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project's packages
    sys.exit(main(sys.argv[1:]))
