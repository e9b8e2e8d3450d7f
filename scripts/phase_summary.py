"""Seconds per phase and per evaluation from a GPU worker's activity log (JSON lines, plain or .gz):
`python scripts/phase_summary.py docs/gpu_runs/session-2026-11-30c/run3/gpu0.log.gz`. The tables in
docs/throughput.md are its output."""

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


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(f"== {p}\n{summarize(p)}")
