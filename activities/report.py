"""`marathon report ID`: Markdown plus PNG plots from the run's ledger in the artifact store."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from workflows.artifacts import ArtifactStore
from activities.ledger import read_ledger
from workflows.contracts import IterationRecord
from workflows.text import INTERPRETER_NOTE, best_text, clip


def write_report(st, wid: str, out: Path, unledgered: list[IterationRecord] = ()) -> Path:
    """The report of run `wid` into `out`, from its status or result `st` (both carry the ledger key) and, for
    a live run, the records its ledger does not hold yet."""
    store = ArtifactStore()
    records = read_ledger(store, st.ledger_key)
    seen = {r.iteration for r in records}
    records += sorted((r for r in unledgered if r.iteration not in seen), key=lambda r: r.iteration)
    out.mkdir(parents=True, exist_ok=True)
    plots = _plots(records, out)
    best_src = None
    best_key = getattr(st, "best_source_key", None)
    if best_key is None and st.best is not None:
        best_key = next((r.source_key for r in records if r.candidate_id == st.best.candidate_id), None)
    if best_key and store.exists(best_key):
        best_src = store.get_text(best_key)
    md = render_markdown(wid, st, records, plots, best_src, _receipt(store, records, st.best))
    path = out / "report.md"
    path.write_text(md)
    return path


def render_markdown(wid: str, st, records: list[IterationRecord], plots: list[str], best_src: str | None,
                    receipt: str | None = None) -> str:
    interp = any(r.interpreter for r in records) or bool(st.best and st.best.interpreter)
    stopped = getattr(st, "stopped_by", None)
    reason = getattr(st, "stop_reason", None)
    lines = [f"# Run {wid}: {st.problem}", ""]
    lines.append(f"- iterations: {len(records)} recorded"
                 + (f", stopped by {stopped}" if stopped else f", still running (phase {getattr(st, 'phase', '?')})")
                 + (f", stop reason: {reason}" if reason else ""))
    lines.append(f"- workflow runs (continue-as-new generations): {st.runs}")
    u = st.used
    lines.append(f"- used: {u.seconds / 3600:.3f} h wall, {u.gpu_seconds:.1f} GPU-s, "
                 f"{u.tokens_in} tokens in / {u.tokens_out} out, {u.turns} model turns, {u.tool_calls} tool calls, "
                 f"estimated cost ${u.cost_usd:.2f}")
    if st.best:
        lines.append(f"- best: {best_text(st.best)}; `marathon export {wid}` writes it to a file")
    else:
        lines.append("- best: none passed")
    if interp:
        lines.append(f"- **{INTERPRETER_NOTE}.**")
    lines.append("")
    for p in plots:
        lines.append(f"![{p}]({p})")
    rej = Counter((r.stage, clip(r.reason, 80)) for r in records if r.outcome == "rejected")
    lines += ["", "## Rejections by stage and reason", "", "| stage | reason | count |", "|---|---|---|"]
    lines += [f"| {s} | {reason.replace('|', '/')} | {n} |" for (s, reason), n in rej.most_common(20)] or ["| - | none | 0 |"]
    fam = Counter(r.family for r in records if r.outcome == "rejected" and r.family)
    lines += ["", "## Rejections by cheating family", "", "| family | count |", "|---|---|"]
    lines += [f"| {f} | {n} |" for f, n in fam.most_common()] or ["| none | 0 |"]
    # speedup and ms: device time on the worst distribution (named); host: a synchronous call's latency
    lines += ["", "## Iterations", "", "| # | candidate | outcome | speedup (worst distribution) | ms | host ms | note |",
              "|---|---|---|---|---|---|---|"]
    for r in records:
        note = f"{r.stage}: {clip(r.reason, 60)}" if r.outcome == "rejected" else clip(r.rationale, 60)
        sp = f"{r.speedup:.3g}" if r.speedup is not None and not r.interpreter else "-"
        if sp != "-" and r.deciding_dist:
            sp += f" ({r.deciding_dist})"
        ms = f"{r.time_ms:.4g}" if r.time_ms is not None else "-"
        host = f"{r.host_ms:.4g}" if r.host_ms is not None and not r.interpreter else "-"
        lines.append(f"| {r.iteration} | {r.candidate_id} | {r.outcome} | {sp} | {ms} | {host} | "
                     f"{note.replace('|', '/')} |")
    if best_src:
        lines += ["", "## Best kernel", "", "```python", best_src.rstrip(), "```"]
    if receipt:
        lines += ["", "## Verification receipt of the best kernel", "", "```", receipt, "```"]
    return "\n".join(lines) + "\n"


def _receipt(store: ArtifactStore, records: list[IterationRecord], best) -> str | None:
    """The benchmark log lines of the best kernel's accepted measurement: receipt, spread, floor check."""
    if best is None:
        return None
    rec = next((r for r in reversed(records) if r.candidate_id == best.candidate_id and r.log_key), None)
    if rec is None or not store.exists(rec.log_key):
        return None
    keep = ("receipt:", "physical floor", "profiler cross-check", "ncu proof", "wall medians")
    lines = [ln for ln in store.get_text(rec.log_key).splitlines() if ln.startswith(keep)]
    lines.append(f"rel. error vs oracle: {rec.rel_err:.3g}" if rec.rel_err is not None else "")
    return "\n".join(ln for ln in lines if ln) or None


def progress_series(records: list[IterationRecord]) -> dict[str, list[float]]:
    """What progress.png draws. By iteration: each measured candidate's figure and the crowned best after
    it. By wall time: the best among the records finished so far, in the order they finished (evaluations
    run in parallel, so iteration order is not time order). The figure is the speedup on a GPU; under the
    interpreter, the time in ms, as interpreter ratios to the baseline mean nothing."""
    interp = any(r.interpreter for r in records)

    def figure(r):
        return r.time_ms if interp else r.speedup

    def running_best(order):
        # Each improvement beat the best recorded before it, and records are crowned in iteration order: the
        # best among the records seen so far is the improved one of the highest iteration, whatever their order.
        crowned, out = None, []
        for r in order:
            if r.outcome == "improved" and r.speedup and (crowned is None or r.iteration > crowned.iteration):
                crowned = r
            out.append(float("nan") if crowned is None else figure(crowned))
        return out

    t0 = min((r.started_at for r in records if r.started_at), default=0.0)
    by_iter = sorted(records, key=lambda r: r.iteration)
    by_time = sorted(records, key=lambda r: r.finished_at)
    measured = [r for r in by_iter if r.outcome in ("passed", "improved") and figure(r) is not None]
    return {"iter": [r.iteration for r in by_iter], "best": running_best(by_iter),
            "minutes": [(r.finished_at - t0) / 60 for r in by_time], "best_by_time": running_best(by_time),
            "cand_iter": [r.iteration for r in measured], "cand": [figure(r) for r in measured]}


#: under the progress picture: a dot past the crowned line is no error (decisions.improves_on)
CROWN_NOTE = ("A dot past the crowned line is one timing of its own; a candidate is crowned only when it beats the "
              "best with 95% confidence in one head-to-head timing, so one that looks faster may stay uncrowned.")


def progress_figure(records: list[IterationRecord]):
    """progress.png's figure: by iteration each verified candidate and the crowned best, by wall time the
    crowned best; its legend and note say what crowning takes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    interp = any(r.interpreter for r in records)
    s = progress_series(records)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.9))
    ax[0].scatter(s["cand_iter"], s["cand"], s=12, color="0.6", label="each verified candidate (one timing)")
    ax[0].step(s["iter"], s["best"], where="post", label="crowned best (a confident win)")
    ax[0].set_xlabel("iteration")
    ax[0].set_ylabel("interpreter time (ms)" if interp else "speedup (worst distribution)")
    ax[0].legend(fontsize=8)
    ax[1].step(s["minutes"], s["best_by_time"], where="post")
    ax[1].set_xlabel("wall time (min)")
    ax[1].set_ylabel("crowned best's interpreter time (ms)" if interp else "best speedup")
    fig.suptitle("Triton interpreter on the CPU: these times measure nothing about GPU speed" if interp
                 else "verified speedups over the baseline, by device time", fontsize=10)
    fig.text(0.01, 0.01, CROWN_NOTE, fontsize=7.5, color="0.3")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def _plots(records: list[IterationRecord], out: Path) -> list[str]:
    if not records:
        return []
    fig = progress_figure(records)
    import matplotlib.pyplot as plt

    fig.savefig(out / "progress.png", dpi=100)
    plt.close(fig)
    names = ["progress.png"]
    rej = Counter(r.stage for r in records if r.outcome == "rejected")
    if rej:
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.barh(list(rej), list(rej.values()))
        ax.set_xlabel("rejections")
        fig.tight_layout()
        fig.savefig(out / "rejections.png", dpi=100)
        plt.close(fig)
        names.append("rejections.png")
    return names
