"""Seconds per phase and per evaluation from a GPU worker's activity log (JSON lines, plain or .gz):
`python scripts/phase_summary.py [--concurrency] docs/gpu_runs/session-2026-11-30c/run3/gpu0.log.gz`. The
tables in docs/throughput.md are its output."""

from __future__ import annotations

import gzip
import json
import sys
from collections import defaultdict


def summarize(path: str, top: int = 14) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    acts: dict[str, list[dict]] = defaultdict(list)
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith("{"):
                d = json.loads(line)
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


def concurrency(path: str, step: float = 15.0, window: float = 30.0) -> str:
    """Activities running at every `step` seconds of the log's span (each line's end time less its
    duration is its start), and benchmarks finished per `window` seconds: how full the pipeline was."""
    from datetime import datetime

    opener = gzip.open if path.endswith(".gz") else open
    spans = []
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith("{"):
                d = json.loads(line)
                end = datetime.fromisoformat(d["timestamp"].replace("Z", "+00:00")).timestamp()
                spans.append((end - (d.get("seconds") or 0), end, d.get("event")))
    if not spans:
        return "no activities"
    t0, t1 = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
    running = [sum(s <= t0 + k < e for s, e, _ in spans) for k in range(0, int(t1 - t0), int(step))]
    bench = [e - t0 for _, e, ev in spans if ev == "benchmark"]
    done = [sum(k <= x < k + window for x in bench) for k in range(0, int(t1 - t0), int(window))]
    return (f"span {t1 - t0:.0f} s\n    running activities every {step:g} s: {running}\n"
            f"    benchmarks finished per {window:g} s: {done}")


if __name__ == "__main__":
    # `--concurrency` also prints how full the pipeline was over time (docs/throughput.md, session e)
    paths = [p for p in sys.argv[1:] if p != "--concurrency"]
    for p in paths:
        print(f"== {p}\n{summarize(p)}")
        if "--concurrency" in sys.argv[1:]:
            print(concurrency(p))
