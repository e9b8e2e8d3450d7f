"""Seconds per phase and per evaluation from a GPU worker's activity log (JSON lines, plain or .gz):
`python scripts/phase_summary.py [--concurrency [--agent agent.log]] [--rate] [--per-minute] [--run ID_PREFIX]
[--after S] [--smi session.json --gpu N] gpu0.log` (the logs and session.json that scripts/gpu_session.py
writes). docs/results.md's search throughput is its output.

--run keeps one run's activities (workflow id prefix); --after keeps those that started at least S seconds
after the log's first one (past warm-up); --rate prints the benchmarks finished per hour between the first
and the last, with nvidia-smi's mean utilization and peak memory over that span from a gpu_session.py
session.json, the host's CPU use and the share of time new untimed device jobs waited for timing (the
device owner's closed time: marathon_gpu_closed_seconds_total). Every view prints how many timing blocks
shared one drain of the device (the phases gpu-blocks and gpu-drains)."""

from __future__ import annotations

import gzip
import json
import sys
from collections import defaultdict


def _end(d: dict) -> float:
    from datetime import datetime

    return datetime.fromisoformat(d["timestamp"].replace("Z", "+00:00")).timestamp()


def _json_lines(path: str) -> list[dict]:
    """A worker log's JSON lines (plain or .gz); its plain-text lines are left out."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def activities(path: str, run: str = "", after: float = 0.0) -> list[dict]:
    """The log's activity lines (JSON), those of runs whose workflow id starts with `run`, that started at
    least `after` seconds after the first activity of the whole log started."""
    rows = _json_lines(path)
    if not rows:
        return []
    t0 = min(_end(d) - (d.get("seconds") or 0) for d in rows)
    return [d for d in rows if d.get("workflow_id", "").startswith(run)
            and _end(d) - (d.get("seconds") or 0) >= t0 + after]


def _benchmark_ends(rows: list[dict]) -> list[float]:
    return sorted(_end(d) for d in rows if d.get("event") == "benchmark")


def rate(rows: list[dict], smi: list | None = None, gpu: int = 0, cpu: list | None = None,
         samples: list | None = None) -> str:
    """Benchmarks finished per hour between the first and the last finished one; with nvidia-smi rows
    ((time, gpu, utilization %, memory MiB, SM MHz), gpu_session.py's session.json "smi"), the mean
    utilization and the peak memory of `gpu` over the same span; with its "cpu" rows (time, busy share,
    load average), the host's mean CPU use; with its "samples", the share of the span that worker gpu`gpu`'s
    new untimed device jobs waited for timing (marathon_gpu_closed_seconds_total)."""
    ends = _benchmark_ends(rows)
    if len(ends) < 2:
        return f"{len(ends)} benchmarks: no rate"
    span = ends[-1] - ends[0]
    out = f"{len(ends)} benchmarks, {(len(ends) - 1) / span * 3600:.0f}/h over {span:.0f} s (first to last)"
    if smi:
        inside = [r for r in smi if r[1] == gpu and ends[0] <= r[0] <= ends[-1]]
        if inside:
            out += (f"; nvidia-smi GPU {gpu}: utilization {sum(r[2] for r in inside) / len(inside):.1f}%, "
                    f"peak memory {max(r[3] for r in inside) / 1024:.0f} GiB")
    inside = [r for r in cpu or () if ends[0] <= r[0] <= ends[-1]]
    if inside:
        out += (f"; host CPU busy {100 * sum(r[1] for r in inside) / len(inside):.0f}% "
                f"(load average {sum(r[2] for r in inside) / len(inside):.1f})")
    pts = [(x["t"], x["closed"][f"gpu{gpu}"]) for x in samples or ()
           if ends[0] <= x["t"] <= ends[-1] and (x.get("closed") or {}).get(f"gpu{gpu}") is not None]
    if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
        share = 100 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
        out += f"; new jobs waited for timing {share:.0f}% of the time"
    return out


def per_minute(rows: list[dict]) -> str:
    """Benchmarks finished in each whole minute from the first finished one (x60: a rate per hour), so that
    the warm-up's batch, the pipeline's refill and a compaction's drain show as what they are."""
    ends = _benchmark_ends(rows)
    if not ends:
        return "no benchmarks"
    bins = [0] * int((ends[-1] - ends[0]) // 60)  # whole minutes only: a last partial one says nothing
    for e in ends:
        k = int((e - ends[0]) // 60)
        if k < len(bins):
            bins[k] += 1
    return f"benchmarks per minute from the first: {bins}; per hour: {[60 * n for n in bins]}"


def summarize(rows: list[dict], top: int = 14) -> str:
    """Per activity kind: how many, their mean seconds, and the phases that took the most, in total and per
    activity (`activities`' rows)."""
    acts: dict[str, list[dict]] = defaultdict(list)
    for d in rows:
        acts[d.get("event")].append(d)
    out = []
    for event, rows in acts.items():
        out.append(f"{event}: {len(rows)} activities, mean {sum(r.get('seconds') or 0 for r in rows) / len(rows):.2f} s")
        total: dict[str, float] = defaultdict(float)
        for r in rows:
            for k, v in (r.get("phases") or {}).items():
                total[k] += v
        for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
            out.append(f"    {k:<26} {v:9.2f} total  {v / len(rows):7.2f} per activity")
    return "\n".join(out)


def drains(rows: list[dict]) -> str:
    """Timing blocks per drain: the device owner's `gpu-blocks` (one per timing block) over its `gpu-drains`
    (one per block that drained the device of untimed jobs and opened a timing window), summed over the
    activities' phases; empty when no activity ran a timing block."""
    blocks = sum((d.get("phases") or {}).get("gpu-blocks", 0) for d in rows)
    windows = sum((d.get("phases") or {}).get("gpu-drains", 0) for d in rows)
    if not blocks:
        return ""
    return (f"timing blocks: {blocks:.0f} after {windows:.0f} drains, {blocks / windows:.2f} per drain" if windows
            else f"timing blocks: {blocks:.0f}, their drains in activities left out")


def handed_on(rows: list[dict]) -> str:
    """How many verifications took the child their candidate's compile left loaded (`handed-on`), and how
    many loaded it afresh, compiling it again; empty when no verification ran."""
    ver = [d.get("phases") or {} for d in rows if d.get("event") == "verify"]
    if not ver:
        return ""
    again = [ph.get("compile", 0.0) for ph in ver if not ph.get("handed-on")]
    tail = f", compiling again {sum(again) / len(again):.2f} s each" if again else ""
    return f"verifications given the compile's child: {len(ver) - len(again)} of {len(ver)}{tail}"


def render_seeds(rows: list[dict]) -> str:
    """Per stage, the activities that loaded a render of the problem's template (`render-seed-n`): how many
    were given entries its earlier children compiled (`render-seed-n`), and the Triton compile's seconds
    with and without them; empty when no render was loaded."""
    parts = []
    for ev in ("compile", "verify", "benchmark"):
        ph = [d.get("phases") or {} for d in rows if d.get("event") == ev and "render-seed-n" in (d.get("phases") or {})]
        if not ph:
            continue
        given = [x.get("compile", 0.0) for x in ph if x.get("render-seed-n", 0) > 0]
        bare = [x.get("compile", 0.0) for x in ph if x.get("render-seed-n", 0) <= 0]
        figs = ", ".join(f"{what} {sum(v) / len(v):.2f} s" for what, v in (("given", given), ("not", bare)) if v)
        parts.append(f"{ev} {len(given)} of {len(ph)} (compiling {figs})")
    return "renders given their kernels: " + "; ".join(parts) if parts else ""


def compactions(path: str, run: str = "") -> list[float]:
    """When each compaction of the runs whose workflow id starts with `run` finished (epoch seconds), from
    the agent worker's log (`compacted` lines)."""
    return sorted(_end(d) for d in _json_lines(path)
                  if d.get("event") == "compacted" and d.get("workflow_id", "").startswith(run))


def concurrency(rows: list[dict], step: float = 15.0, window: float = 30.0,
                compacted: list[float] | None = None) -> str:
    """Activities running at every `step` seconds of the log's span (each line's end time less its
    duration is its start), and benchmarks finished per `window` seconds: how full the pipeline was.
    `compacted` (epoch seconds, from compactions()) is printed on the same clock, so a compaction's
    effect on the two series can be read off."""
    spans = [(_end(d) - (d.get("seconds") or 0), _end(d), d.get("event")) for d in rows]
    if not spans:
        return "no activities"
    t0, t1 = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
    running = [sum(s <= t0 + k < e for s, e, _ in spans) for k in range(0, int(t1 - t0), int(step))]
    bench = [e - t0 for _, e, ev in spans if ev == "benchmark"]
    done = [sum(k <= x < k + window for x in bench) for k in range(0, int(t1 - t0), int(window))]
    out = (f"span {t1 - t0:.0f} s\n    running activities every {step:g} s: {running}\n"
           f"    benchmarks finished per {window:g} s: {done}")
    if compacted is not None:
        out += f"\n    compactions finished at (s): {[round(c - t0) for c in compacted]}"
    return out


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--concurrency", action="store_true", help="how full the pipeline was over time")
    ap.add_argument("--rate", action="store_true", help="benchmarks per hour, first to last")
    ap.add_argument("--per-minute", action="store_true", help="benchmarks finished in each minute")
    ap.add_argument("--run", default="", help="only the runs whose workflow id starts with this")
    ap.add_argument("--after", type=float, default=0.0, help="only activities started this many seconds in")
    ap.add_argument("--smi", default="", help="a gpu_session.py session.json, for --rate's nvidia-smi, CPU and "
                    "waits-for-timing figures")
    ap.add_argument("--gpu", type=int, default=0, help="the nvidia-smi GPU index for --smi")
    ap.add_argument("--agent", default="", help="the agent worker's log, for --concurrency's compaction times")
    a = ap.parse_args(argv)
    session = json.load(open(a.smi)) if a.smi else {}
    for p in a.logs:
        rows = activities(p, a.run, a.after)  # the log read once for every view below
        print(f"== {p}\n{summarize(rows)}")
        for line in (drains(rows), handed_on(rows), render_seeds(rows)):
            if line:
                print(line)
        if a.concurrency:
            print(concurrency(rows, compacted=compactions(a.agent, a.run) if a.agent else None))
        if a.rate:
            print(rate(rows, session.get("smi"), a.gpu, session.get("cpu"), session.get("samples")))
        if a.per_minute:
            print(per_minute(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
