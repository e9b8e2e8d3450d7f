"""Cross-examine a scoreboard by an independent device-time measurement, in a process of its own.

For every row of scoreboard.json, the starting kernel (imported directly, no sandbox) and the primary
baseline are timed on every distribution with gpu_worker.devicetime (a CUDA graph per rotated input copy,
together as much as the harness's L2 flush reads, no refill and no harness), and each figure is compared
with the scoreboard's. Prints one line per (row, distribution, side) and one per (row, distribution) for
the speedup, and exits 1 if any judged speedup disagrees with the independent one (gpu_worker.timing.agreement:
at most 2% above it; below it by at most the fresh-value refill's cost for a kernel under 50 us, else by at
most --tolerance).

    python scripts/device_time_check.py [--scoreboard docs/scoreboard.json] [--tolerance 0.03] [--only kda ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def load_module(source: str, tmp: Path):
    path = tmp / "start_kernel.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("start_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    import torch

    from baselines.registry import get_problem
    from gpu_worker.devicetime import graph_time_ms, rotated_copies
    from gpu_worker.timing import agreement

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scoreboard", default="docs/scoreboard.json")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--only", action="append", default=[],
                    help="PROBLEM or PROBLEM@SHAPE_NAME: check only these rows (repeatable)")
    a = ap.parse_args(argv)
    try:
        rows = json.loads(Path(a.scoreboard).read_text())
    except (OSError, ValueError) as e:
        ap.error(f"--scoreboard {a.scoreboard}: {e}")
    if a.only:
        rows = [r for r in rows if r["problem"] in a.only or f"{r['problem']}@{r['shape']}" in a.only]
        if not rows:
            ap.error(f"no scoreboard row matches {', '.join(a.only)}")
    if not torch.cuda.is_available():
        ap.error("a device-time measurement needs a CUDA device")
    worst, lines, disagree = 0.0, [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows:
            problem = get_problem(row["problem"])
            shape = next(s for s in problem.shapes if s.name == row["shape"])
            mod = load_module(problem.render(problem.default_knobs()), Path(tmp))
            bases = problem.baselines()
            if row["baseline"] not in bases:
                ap.error(f"{row['problem']}'s baseline {row['baseline']!r} is not available here "
                         f"(available: {', '.join(bases) or 'none'})")
            base = bases[row["baseline"]]
            for d in row.get("start_distributions") or []:
                dist = d["dist"]
                inputs = rotated_copies(lambda i: problem.make_inputs(shape, dist, 9000 + i, "cuda"))
                sets = [{"inputs": inp, "out": {k: torch.empty(o.shape, dtype=getattr(torch, o.dtype), device="cuda")
                                                for k, o in problem.output_specs(shape).items()}} for inp in inputs]
                start = graph_time_ms(lambda s: mod.run(s["inputs"], s["out"]), sets)
                baseline = graph_time_ms(lambda s: base(s["inputs"]), sets)
                for side, here, there in (("start", start, d["time_ms"]), ("baseline", baseline, d["baseline_ms"])):
                    dev = here["ms"] / there - 1
                    worst = max(worst, abs(dev))
                    lines.append(f"{row['problem']:<12} {row['shape']:<24} {dist:<7} {side:<8} independent "
                                 f"{here['ms']:.4g} ms ({here['mode']}, {here['copies']} copies) vs scoreboard "
                                 f"{there:.4g} ms: {100 * dev:+.1f}%")
                    print(lines[-1], flush=True)
                judged, independent = d["baseline_ms"] / d["time_ms"], baseline["ms"] / start["ms"]
                ok, low, high = agreement(judged, independent, start["ms"], a.tolerance)
                disagree += not ok
                lines.append(f"{row['problem']:<12} {row['shape']:<24} {dist:<7} speedup  judged {judged:.3f}x, "
                             f"independent {independent:.3f}x: {'agrees' if ok else 'DISAGREES'} "
                             f"(allowed {low:.3f}-{high:.3f}x)")
                print(lines[-1], flush=True)
                del inputs, sets
                torch.cuda.empty_cache()
    print(f"largest difference of a figure {100 * worst:.1f}%; {disagree} speedup(s) disagree")
    return 0 if not disagree else 1


if __name__ == "__main__":
    sys.exit(main())
