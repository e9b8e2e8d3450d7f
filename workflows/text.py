"""How budgets, bests and iterations read to a person: one wording for the CLI, the Web UI's details and
the report. Pure functions of the contracts (the workflow renders its details with them)."""

from __future__ import annotations

from workflows.contracts import Budget, Used

# Said wherever interpreter timings are shown instead of a speedup.
INTERPRETER_NOTE = ("no GPU: kernels ran under the Triton interpreter on the CPU, and interpreter times measure "
                    "nothing about a kernel's speed, so no speedups are shown. The loop still ranks candidates "
                    "by them and crowns one only when it beats the best in the same head-to-head timing with "
                    "95% confidence, so its choices here check the machinery, not the kernels")


# Said to a model of a kernel that ran under the interpreter: its times, and the baseline's (torch on the
# CPU), measure nothing about speed, so their ratio would mislead it.
INTERPRETER_VERDICT = "under the Triton interpreter no speed is measured (speedups come from a GPU)"


def measured_text(r) -> str:
    """A timed IterationRecord's measurement as a model reads it: its speedup and time, or, under the
    interpreter, that no speed was measured (a ratio of interpreter timings would mislead it)."""
    if r.interpreter:
        return "no speed measured (interpreter)"
    return f"{r.speedup:.3f}x, {r.time_ms:.4g} ms" if r.time_ms is not None else f"{r.speedup:.3f}x"


def model_result_text(r, reason_chars: int) -> str:
    """A record's result in one line for a model (`record_text` is the operator's): its measurement
    (`measured_text`), or where it was rejected and why, the reason clipped to `reason_chars`."""
    return measured_text(r) if r.speedup is not None else f"rejected at {r.stage}: {clip(r.reason, reason_chars)}"


def _num(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.3g}"


def iterations_text(n: int) -> str:
    return f"{n:,} iteration{'' if n == 1 else 's'}"


def budget_text(budget: Budget) -> str:
    """`30 iterations, 2 h, 50,000 tokens, 600 GPU-s`; fields without a limit are left out."""
    parts = []
    if budget.iterations is not None:
        parts.append(iterations_text(budget.iterations))
    if budget.hours is not None:
        parts.append(f"{_num(budget.hours)} h")
    if budget.tokens is not None:
        parts.append(f"{budget.tokens:,} tokens")
    if budget.gpu_seconds is not None:
        parts.append(f"{_num(budget.gpu_seconds)} GPU-s")
    return ", ".join(parts) or "no limit"


def used_text(used: Used, llm: bool = False) -> str:
    text = (f"{used.iterations:,} iterations, {used.seconds / 3600:.2f} h, {used.gpu_seconds:,.1f} GPU-s, "
            f"{used.tokens:,} tokens")
    if llm:
        text += (f" ({used.tokens_in:,} in, {used.tokens_out:,} out), {used.turns} model turns, "
                 f"{used.tool_calls} tool calls, ~${used.cost_usd:.2f}")
    return text


def left_text(budget: Budget, used: Used) -> str:
    """What is left of each limited budget: `18 iterations, 1.60 h`; `no limit` when none is set."""
    parts = []
    if budget.iterations is not None:
        parts.append(iterations_text(max(0, budget.iterations - used.iterations)))
    if budget.hours is not None:
        parts.append(f"{max(0.0, budget.hours - used.seconds / 3600):.2f} h")
    if budget.tokens is not None:
        parts.append(f"{max(0, budget.tokens - used.tokens):,} tokens")
    if budget.gpu_seconds is not None:
        parts.append(f"{max(0.0, budget.gpu_seconds - used.gpu_seconds):,.1f} GPU-s")
    return ", ".join(parts) or "no limit"


def best_text(best) -> str:
    """A BestRef or BestSummary; interpreter timings without a ratio."""
    if best is None:
        return "none yet"
    where = f"{best.candidate_id}, iteration {best.iteration}"
    if best.interpreter:
        return f"{best.time_ms:.4g} ms under the interpreter ({where})"
    return f"{best.speedup:.3g}x, {best.time_ms:.4g} ms vs baseline {best.baseline_ms:.4g} ms ({where})"


def evaluation_summary(iteration: int, candidate_id: str, budget: Budget, st) -> str:
    """One line for an evaluation's child workflow: its candidate and the run's progress when it started (best,
    budget left). The Web UI labels the child's row on the run's Timeline with it, newest first, so the run's
    main page shows its progress (the server keeps at most 400 bytes of a summary)."""
    b = st.best
    if b is None:
        best = "none yet"
    elif b.interpreter:
        best = f"{b.time_ms:.4g} ms (#{b.iteration}, interpreter)"
    else:
        best = f"{b.speedup:.3g}x, {b.time_ms:.4g} ms (#{b.iteration})"
    return f"#{iteration} {candidate_id} | best {best} | left {left_text(budget, st.used)}"[:300]


def clip(text: str | None, n: int) -> str:
    """The first line of `text` in at most n characters, cut between words ("..." marks a cut)."""
    lines = (text or "").strip().splitlines()
    line = lines[0].strip() if lines else ""
    if len(line) <= n:
        return line
    cut = line[:n - 3]
    head = cut.rsplit(" ", 1)[0].rstrip(" ,;:")
    return (head if len(head) >= n // 2 else cut) + "..."  # one long word is cut where it must be


def record_text(rec) -> str:
    """One IterationRecord as a short line."""
    if rec.outcome == "rejected":
        reason = clip(rec.reason, 70)
        return f"#{rec.iteration} rejected at {rec.stage}: {reason}"
    if rec.time_ms is None:
        return f"#{rec.iteration} {rec.outcome}"
    if rec.interpreter or rec.speedup is None:
        return f"#{rec.iteration} {rec.outcome} {rec.time_ms:.4g} ms" + (" [interpreter]" if rec.interpreter else "")
    return f"#{rec.iteration} {rec.outcome} {rec.speedup:.3g}x {rec.time_ms:.4g} ms"


def run_summary(spec) -> str:
    """One line for a RunSpec: the Web UI's summary of the run's start, repeated atop every run's details."""
    extra = "".join(f", {k} {v}" for k, v in (("shape", spec.shape), ("population", spec.population))
                    if v not in (None, 1))
    return f"{spec.problem}: {spec.policy} policy, budget {budget_text(spec.budget)}{extra}"[:190]


def run_details(spec, st, phase: str, stop) -> str:
    """Markdown for the Web UI's current details (User Metadata), set again in every run (a run started by
    continue-as-new has no start summary of its own, so the summary heads them): the state, then the crowned
    best and the leaderboard as one numbered list (the Web UI runs a table's headers together)."""
    b, last = st.best, st.last
    interp = (b is not None and b.interpreter) or (last is not None and last.interpreter)
    lines = [f"**{run_summary(spec)}**", "",
             f"- iteration {st.iteration}, run {st.runs}, phase {phase}",
             f"- budget: {budget_text(spec.budget)}",
             f"- used: {used_text(st.used, spec.policy == 'llm')}",
             f"- left: {left_text(spec.budget, st.used)}",
             f"- best: {best_text(b)}"]
    if st.paused:
        lines.append(f"- paused: {st.pause_reason}")
    if stop is not None:
        lines.append(f"- stopping: {stop.reason}")
    if last is not None:
        lines.append(f"- last: {record_text(last)}")
    lines += [f"- refused: {r}" for r in st.refused]
    if interp:
        lines += ["", f"_{INTERPRETER_NOTE}._"]
    rows = ([(b.candidate_id, b.speedup, b.time_ms, b.iteration, " (crowned best)")] if b else []) + [
        (e.candidate_id, e.speedup, e.time_ms, e.iteration, "") for e in st.leaderboard
        if b is None or e.candidate_id != b.candidate_id]
    if rows:
        lines += ["", "**Leaderboard** (" + ("interpreter time" if interp else "speedup, device time")
                  + "; the crowned best first)", ""]
        for i, (cid, speedup, ms, it, note) in enumerate(rows, 1):
            figures = f"{ms:.4g} ms" if interp else f"{speedup:.3g}x, {ms:.4g} ms"
            lines.append(f"{i}. `{cid}`: {figures}, iteration {it}{note}")
    return "\n".join(lines)[:19000]


def result_summary(iterations: int, stopped_by: str, stop_reason: str | None, best, cancelled: int = 0) -> str:
    """A finished run in one line, first in its result."""
    why = stopped_by + (f" ({stop_reason})" if stop_reason else "")
    gone = f", {cancelled} evaluation{'s' * (cancelled != 1)} under way cancelled" if cancelled else ""
    return f"{iterations} iterations, stopped by {why}{gone}; best: {best_text(best)}"
