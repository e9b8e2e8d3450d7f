"""The device's policies and their knobs compared on the simulated schedule (gpu_worker.device.schedule_sim): the
policies' own decisions, simulated time, the H200 KDA run's per-stage costs laid out as the harness asks for
them now (--engine recorded: as it did when the run was recorded), or a phase log's; a table of evaluations
an hour, device busy share (any turn held), timing share, time shut to new jobs, blocks per drain, host cores
busy and the waits per evaluation; then each stage's time and waits. Every list-valued knob is swept; each
row is the mean of --seeds runs (seeds 0, 1, ...), with the lowest and highest rate beside it.

    python scripts/schedule_sim.py --policy owner dispatcher --candidates 24 --jobs 4 8 --batch 2 4 \\
        --window-s 4 --hours 1
    python scripts/schedule_sim.py --beside 0 8 16        # the retried stage waits for memory, not an empty device
    python scripts/schedule_sim.py --log gpu0.log --run kda --after 240     # costs from a phase log
    python scripts/schedule_sim.py --block-scale 0.58 --job-scale 0.5      # what if blocks and jobs were shorter
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_worker.device.turns import DispatchTurns, OwnerTurns  # noqa: E402
from gpu_worker.device.schedule_costs import (ENGINES, RETRY_ALONE, RETRY_BURST, SPREAD, h200_table,  # noqa: E402
                                        table_from_activities)
from gpu_worker.device.schedule_sim import simulate  # noqa: E402

COLUMNS = ["policy", "cand", "jobs", "batch", "window_s", "max_wait_s", "beside", "evals_per_h", "range", "busy",
           "timing", "shut", "blocks_per_drain", "host", "job_wait_s", "block_wait_s", "stage_wait_s", "bad"]


def settings(a) -> list[dict]:
    """Every combination of the knobs, once per policy (the owner has no batch or max wait)."""
    out, seen = [], set()
    for policy, cand, jobs, batch, window, wait, beside in itertools.product(
            a.policy, a.candidates, a.jobs, a.batch, a.window_s, a.max_wait_s, a.beside):
        if policy == "owner":
            batch = wait = None
        key = (policy, cand, jobs, batch, window, wait, beside)
        if key not in seen:
            seen.add(key)
            out.append(dict(zip(COLUMNS[:7], key)))
    return out


def turns_for(s: dict, mem_gb: float | None):
    if s["policy"] == "owner":
        return OwnerTurns(s["jobs"], s["window_s"])
    return DispatchTurns(s["jobs"], s["batch"], s["max_wait_s"], s["window_s"], mem_gb)


def row(s: dict, a, table) -> dict:
    reports = [simulate(turns_for(s, a.mem_gb), table, s["cand"], a.cores, a.hours, a.warmup_s, seed,
                        retry_alone=a.retry_alone, retry_burst=a.retry_burst, beside=s["beside"])
               for seed in range(a.seeds)]

    def mean(f) -> float:
        return sum(f(r) for r in reports) / len(reports)

    def per_eval(key: str) -> float:  # seconds a candidate waited for `key` over its three stages
        return mean(lambda r: sum(r.waits[st].get(key, 0.0) for st in r.waits))

    rates = [r.evaluations_per_hour for r in reports]
    stages = {st: {k: round(mean(lambda r: r.waits[st].get(k, 0.0)), 2) for k in reports[0].waits[st]}
              for st in reports[0].waits}
    return {**s, "stages": stages, "evals_per_h": round(mean(lambda r: r.evaluations_per_hour)),
            "range": f"{min(rates):.0f}-{max(rates):.0f}", "busy": round(mean(lambda r: r.busy), 2),
            "timing": round(mean(lambda r: r.timing), 2), "shut": round(mean(lambda r: r.shut_to_jobs), 2),
            "blocks_per_drain": round(mean(lambda r: r.blocks_per_drain), 2),
            "host": round(mean(lambda r: r.host_busy), 2), "job_wait_s": round(per_eval("gpu-job-wait"), 1),
            "block_wait_s": round(per_eval("gpu-wait"), 1), "stage_wait_s": round(per_eval("stage-wait"), 1),
            "bad": sum(len(r.bad) for r in reports)}


def table_text(rows: list[dict]) -> str:
    cells = [[("-" if r[c] is None else str(r[c])) for c in COLUMNS] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in cells]
    lines.append("per stage, seconds per activity (stage: its whole time; waits for a job, a block, the stage gate, "
                 "the reference child's lock, a core):")
    for r in rows:
        knobs = " ".join(f"{c}={r[c]}" for c in COLUMNS[:7] if r[c] is not None)
        parts = [f"{st} {w.get('stage', 0):.1f} ({w.get('gpu-job-wait', 0):.1f} / {w.get('gpu-wait', 0):.1f} / "
                 f"{w.get('stage-wait', 0):.1f} / {w.get('ref-wait', 0):.1f} / {w.get('host-wait', 0):.1f})"
                 for st, w in r["stages"].items()]
        lines.append(f"  {knobs}: " + ", ".join(parts))
    return "\n".join(lines)


def load_table(a):
    if not a.log:
        return h200_table(a.spread, a.engine).scaled(a.job_scale, a.block_scale)
    from scripts.phase_summary import activities

    rows = activities(a.log, a.run, a.after)
    table = table_from_activities(rows, 0.0 if a.spread is None else a.spread, a.engine)
    return table.scaled(a.job_scale, a.block_scale)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", nargs="+", choices=["owner", "dispatcher"], default=["owner", "dispatcher"])
    ap.add_argument("--candidates", nargs="+", type=int, default=[24], help="candidates in flight")
    ap.add_argument("--jobs", nargs="+", type=int, default=[4], help="untimed jobs at once (MARATHON_DEVICE_JOBS)")
    ap.add_argument("--batch", nargs="+", type=int, default=[2], help="dispatcher: MARATHON_TIMING_BATCH")
    ap.add_argument("--window-s", nargs="+", type=float, default=[4.0], help="MARATHON_TIMING_WINDOW_S")
    ap.add_argument("--max-wait-s", nargs="+", type=float, default=[1.0], help="dispatcher: MARATHON_TIMING_MAX_WAIT_S")
    ap.add_argument("--mem-gb", type=float, default=None, help="dispatcher: device memory its jobs may declare")
    ap.add_argument("--beside", nargs="+", type=int, default=[0], help="stages that may run beside one retried "
                    "alone (0: the engine's: it waits for an empty device)")
    ap.add_argument("--engine", choices=ENGINES, default="present", help="the stages' turns as the harness asks "
                    "for them now, or as it did when the H200 run was recorded")
    ap.add_argument("--hours", type=float, default=1.0, help="simulated hours measured, after the warm-up")
    ap.add_argument("--warmup-s", type=float, default=300.0)
    ap.add_argument("--seeds", type=int, default=3, help="runs per row, seeds 0..N-1")
    ap.add_argument("--cores", type=int, default=14, help="host cores for host work (16 less 2 kept for timing)")
    ap.add_argument("--spread", type=float, default=None, help=f"the turns' and host steps' lognormal width "
                    f"(default {SPREAD} for the H200 table, 0 for a log's)")
    ap.add_argument("--retry-alone", type=float, default=RETRY_ALONE, help="chance a stage is retried alone")
    ap.add_argument("--retry-burst", type=int, default=RETRY_BURST, help="stages that run out of memory at one peak")
    ap.add_argument("--block-scale", type=float, default=1.0, help="what if every timing block took this times as "
                    "long")
    ap.add_argument("--job-scale", type=float, default=1.0, help="what if every job turn took this times as long")
    ap.add_argument("--log", default="", help="a GPU worker's phase log (JSON lines) to take the costs from")
    ap.add_argument("--run", default="", help="with --log: only the runs whose workflow id starts with this")
    ap.add_argument("--after", type=float, default=0.0, help="with --log: activities started this many s in")
    ap.add_argument("--json", action="store_true", help="the rows as JSON")
    a = ap.parse_args(argv)
    if a.hours <= 0 or a.seeds < 1 or a.cores < 1 or a.retry_burst < 1 or min(a.candidates + a.jobs + a.batch) < 1:
        ap.error("--hours must be > 0 and --seeds, --cores, --candidates, --jobs, --batch, --retry-burst >= 1")
    if min(a.beside) < 0 or not 0 <= a.retry_alone <= 1:
        ap.error("--beside must be >= 0 and --retry-alone between 0 and 1")
    if min(a.job_scale, a.block_scale) <= 0:
        ap.error("--job-scale and --block-scale must be > 0")
    if a.log and not Path(a.log).is_file():
        ap.error(f"--log {a.log}: no such file")
    if a.spread is None and not a.log:
        a.spread = SPREAD
    try:
        table = load_table(a)
    except (OSError, ValueError, KeyError) as e:  # unreadable, not JSON lines, a line without a timestamp
        ap.error(f"--log {a.log}: {e}")
    rows = [row(s, a, table) for s in settings(a)]
    print(json.dumps(rows, indent=1) if a.json else table_text(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
