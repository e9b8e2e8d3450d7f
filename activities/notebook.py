"""The run's notebook: what was tried, what failed and why, what the measurements said.

Rewritten at every compaction from the previous notebook and the records since; versioned (each
version names its predecessor) and stored in the artifact store. This is the deterministic writer;
the llm policy asks its model to rewrite the notebook and falls back to this one.
"""

from __future__ import annotations

from collections import Counter

from workflows.contracts import BestRef, IterationRecord
from workflows.text import clip


def summarize(problem: str, version: int, previous_key: str | None, records: list[IterationRecord],
              all_records: list[IterationRecord], best: BestRef | None) -> str:
    # interpreter times measure nothing about speed: shown as times, never as ratios
    interp = any(r.interpreter for r in all_records) or bool(best and best.interpreter)
    lines = [f"# Notebook: {problem}, version {version}",
             f"previous version: {previous_key or 'none'}", ""]
    if best and interp:
        lines.append(f"Best so far: {best.candidate_id} at iteration {best.iteration}: {best.time_ms:.4g} ms of "
                     f"interpreter time (not GPU speed); knobs {best.knobs}")
    elif best:
        lines.append(f"Best so far: {best.candidate_id} at iteration {best.iteration}: {best.speedup:.3g}x "
                     f"({best.time_ms:.4g} ms vs baseline {best.baseline_ms:.4g} ms); knobs {best.knobs}")
    else:
        lines.append("Best so far: none has passed yet.")
    outcomes = Counter(r.outcome for r in all_records)
    lines += ["", f"## Totals over {len(all_records)} iterations",
              ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())) or "none"]
    stages = Counter(f"{r.stage}: {clip(r.reason, 100)}"
                     for r in all_records if r.outcome == "rejected")
    if stages:
        lines += ["", "## What failed and why (most frequent first)"]
        lines += [f"- {n}x {reason}" for reason, n in stages.most_common(8)]
    knob_lines = _knob_effects(all_records, interp)
    if knob_lines:
        what = "mean interpreter ms" if interp else "mean speedup"
        lines += ["", f"## What the measurements say about each knob ({what} of passing kernels; "
                      "failures count)"] + knob_lines
    if records:
        lines += ["", f"## Since the last compaction (iterations {records[0].iteration}-{records[-1].iteration})"]
        for r in records[-25:]:
            what = (f"{r.time_ms:.4g} ms (interpreter)" if r.speedup is not None and r.interpreter else
                    f"{r.speedup:.3g}x {r.time_ms:.4g} ms" if r.speedup is not None else
                    f"rejected at {r.stage}: {clip(r.reason, 90)}")
            lines.append(f"- #{r.iteration} {r.candidate_id} {r.outcome}: {what}; {clip(r.rationale, 90)}")
    return "\n".join(lines) + "\n"


def _knob_effects(records: list[IterationRecord], interp: bool = False) -> list[str]:
    per: dict[str, dict[str, list]] = {}
    for r in records:
        for k, v in (r.knobs or {}).items():
            per.setdefault(k, {}).setdefault(repr(v), []).append(r)
    out = []
    for k in sorted(per):
        parts = []
        for v, rs in sorted(per[k].items()):
            ok = [(r.time_ms if interp else r.speedup) for r in rs if r.speedup is not None]
            fails = sum(r.outcome == "rejected" for r in rs)
            mean = (f"{sum(ok) / len(ok):.4g} ms" if interp else f"{sum(ok) / len(ok):.3g}x") if ok else "-"
            parts.append(f"{v}: {mean} ({len(ok)} ok, {fails} failed)")
        out.append(f"- {k}: " + "; ".join(parts))
    return out
