"""Policy `llm`: one model turn and its tool calls, each an activity.

`llm_step(wf)` is the KernelOptimization loop's step for this policy: it asks the model for its next
move (`llm_turn`), then executes every tool call the model made, in order, each as its own activity:
a submission goes through the same rules -> compile -> verify -> benchmark pipeline as a search
candidate and takes the next global iteration number; compile/check/benchmark/profile call the GPU
worker without recording an iteration; the reading tools call `llm_tool`. The answers wait in carried
state (`pending_tool_results`) for the next turn, so a continue-as-new between turns loses nothing; the
conversation itself lives in the artifact store and only its key is carried. So are what the run has
learned about its endpoint (`llm_adapted`), the hints in force, the turns since the last recorded
iteration, which `turns_per_iteration` bounds, and whether the model is getting anywhere
(`llm_progress`: a call failing the same way again is answered with what to do instead, a stuck model is
offered only submit_kernel, and stalled turns end the run as exhausted; workflows/llm_progress.py).

Deterministic: no I/O here, only activity calls and arithmetic on state. The loop is handed in as `wf`
and used through its public surface (`Loop`), so this module imports the workflow's module nowhere.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Protocol

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows import decisions, llm_progress
    from workflows.contracts import (
        AGENT_QUEUE, BenchReport, BestRef, Candidate, CarriedState, CompileReport, EvalRequest,
        IterationRecord, LlmToolRequest, LlmTurnRequest, LlmTurnResult, Phase, ProfileReport, RunSpec,
        StopRequest, ToolCall, ToolResult, VerifyReport,
    )
    from workflows.evaluation import Interrupted, Paused
    from workflows.text import INTERPRETER_VERDICT

# The model's endpoint is retried by Temporal, not by the client: many attempts for rate limits and
# server errors (429s carry their own delay), none for client errors (they are non-retryable).
TURN_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                         maximum_interval=timedelta(seconds=120), maximum_attempts=25)
MAX_STANDING_HINTS = 20  # hints in force at once (the oldest give way)

_ANSWER_CHARS = 2500
# a submission's answer brings the profile only for a new best (decisions.profile_with_verdict)
PROFILE_BESTS_PATCH = "profile-new-bests-only"
# repeated failing calls answered without running them, narrowed turns, stalled turns ending the run
PROGRESS_PATCH = "llm-progress"
# both patches above decided in the run's first activation, before any local activity: a patch marker
# recorded after a local activity's can be met on replay before the code that makes it has run
AT_START_PATCH = "llm-patches-at-start"
# a stop or pause that comes while a turn waits on the model cancels the turn; decided where that happens
# (histories recorded before waited for the turn to end)
INTERRUPT_PATCH = "llm-turn-interrupt"
# turns that only repeat the calls the turn before made and had answered narrow the offer to submit_kernel;
# decided where one is first found (histories recorded before counted them as progress)
REPEATS_PATCH = "llm-repeated-answered-calls"


def patch_on(wf: "Loop", name: str) -> bool:
    """Whether the llm policy's patch `name` is on: at once where the run decided its patches at its start
    (AT_START_PATCH), else by its own marker where the code meets it (histories recorded before)."""
    return wf.llm_patches_at_start or workflow.patched(name)


class Loop(Protocol):
    """What this policy uses of the KernelOptimization loop."""

    spec: RunSpec
    st: CarriedState
    records: list[IterationRecord]  # this run's
    stop: StopRequest | None
    llm_stopped_by: str | None
    llm_patches_at_start: bool  # AT_START_PATCH, decided in the run's first activation

    def set_phase(self, phase: Phase) -> None: ...

    def publish(self) -> None: ...

    async def submit(self, cand: Candidate, profile_if_crowned: bool = False
                     ) -> tuple[IterationRecord, ProfileReport | None]: ...

    async def agent(self, name: str, arg, result_type, minutes: int = 2): ...

    async def gpu(self, name: str, arg, result_type, minutes: int): ...


def _interrupted(wf: Loop) -> bool:
    return wf.stop is not None or wf.st.paused


async def _turn(wf: Loop, req: LlmTurnRequest) -> LlmTurnResult | None:
    """The model's reply; None when a stop or pause came first. A turn retries a failing endpoint for about
    half an hour (TURN_RETRY) and a slow reply may take 20 minutes: the operator's stop or pause does not
    wait for either. The turn is cancelled and asked again on resume (a stopping run evaluates no
    submission of it anyway)."""
    handle = workflow.start_activity(
        "llm_turn", req, result_type=LlmTurnResult, task_queue=AGENT_QUEUE,
        start_to_close_timeout=timedelta(minutes=20),
        heartbeat_timeout=timedelta(seconds=wf.spec.heartbeat_seconds),
        retry_policy=TURN_RETRY, summary=f"llm turn {req.turn}")
    await workflow.wait_condition(lambda: handle.done() or _interrupted(wf))
    if not handle.done() and workflow.patched(INTERRUPT_PATCH):
        handle.cancel()
        try:
            await handle
        except (ActivityError, asyncio.CancelledError):
            pass  # cancelled, as asked; a reply that came meanwhile is asked again
        return None
    try:
        return await handle
    except ActivityError as e:
        cause = e.cause
        msg = str(cause) if cause is not None else str(e)
        raise Paused(f"llm_turn failed: {decisions.trim(msg, 600)}") from e


def _baseline_ms(wf: Loop) -> float | None:
    if wf.st.best is not None:
        return wf.st.best.baseline_ms
    for r in reversed(wf.records):
        if r.baseline_ms:
            return r.baseline_ms
    if wf.st.last is not None and wf.st.last.baseline_ms:
        return wf.st.last.baseline_ms
    return None


async def llm_step(wf: Loop) -> bool:
    """One turn and its tool calls. True when the run should end: the model has stopped getting anywhere
    (llm_progress: stalled turns), or the turn budget is spent."""
    wf.set_phase("proposing")
    hints, wf.st.hints = wf.st.hints, []
    pending = list(wf.st.pending_tool_results)
    progress = wf.st.llm_progress
    turn = wf.st.used.turns + 1
    guarded = patch_on(wf, PROGRESS_PATCH)
    submit_only = llm_progress.narrow_reason(progress, wf.st.turns_since_submission, wf.spec.turns_per_iteration) \
        if guarded else ""
    req = LlmTurnRequest(
        workflow_id=workflow.info().workflow_id, problem=wf.spec.problem, shape=wf.spec.shape,
        model=wf.spec.model, turn=turn, iteration=wf.st.iteration, conversation_key=wf.st.conversation_key,
        notebook_key=wf.st.notebook_key, best=wf.st.best, leaderboard=wf.st.leaderboard,
        recent=wf.records[-8:], baseline_ms=_baseline_ms(wf), budget=wf.spec.budget, used=wf.st.used,
        hints=hints, tool_results=pending, context_tokens=wf.spec.context_tokens,
        ledger_key=wf.st.ledger_key, adapted=wf.st.llm_adapted, turns_per_iteration=wf.spec.turns_per_iteration,
        turns_since_submission=wf.st.turns_since_submission, standing_hints=wf.st.llm_hints,
        device_facts=wf.st.device_facts, submit_only=submit_only)
    if not progress.turns or progress.turns[-1].turn != turn:  # a retried turn keeps when it was first asked
        llm_progress.turn_asked(progress, turn, workflow.now().timestamp(), bool(submit_only))
    try:
        res = await _turn(wf, req)
    except BaseException:
        wf.st.hints = hints + wf.st.hints  # nobody has read them yet
        raise
    if res is None:  # stopped or paused while the model was asked: the loop's top acts on it
        wf.st.hints = hints + wf.st.hints
        return False
    # The turn happened: its answers were delivered, its cost is spent.
    wf.st.conversation_key = res.conversation_key
    wf.st.pending_tool_results = []
    wf.st.llm_adapted = dict(res.adapted)  # kept for the run: later turns start from what was learned
    wf.st.turns_since_submission += 1
    wf.st.llm_hints = (wf.st.llm_hints + [h for h in hints if h not in wf.st.llm_hints])[-MAX_STANDING_HINTS:]
    u = wf.st.used
    u.turns += 1
    u.tokens_in += res.tokens_in
    u.tokens_out += res.tokens_out
    u.cost_usd += res.cost_usd
    u.tool_calls += len(res.tool_calls)
    llm_progress.turn_replied(progress, turn, res.tokens_in, res.tokens_out, res.tool_calls, res.feedback)
    wf.publish()

    iteration_before = wf.st.iteration
    executed = False  # a call was run (not answered as a repeat of a failing one)
    results: list[ToolResult] = []
    try:
        for i, call in enumerate(res.tool_calls):
            if guarded and llm_progress.is_repeat(progress, call):
                result = _answer(call, llm_progress.repeat_answer(call, progress), error=True)
            else:
                result = await _execute(wf, call)
                executed = True
            llm_progress.note_result(progress, call, result)
            llm_progress.call_answered(progress, turn, i, result)
            results.append(result)
    except Paused as p:
        # Infrastructure failed under a tool: answer it and the rest, keep what ran, pause the run.
        done = {r.call_id for r in results}
        for call in res.tool_calls:
            if call.call_id not in done:
                after = "" if isinstance(p, Interrupted) else "; the run paused and resumed. Try again."
                results.append(ToolResult(call_id=call.call_id, name=call.name, error=True, implicit=call.implicit,
                                          content=f"not completed: {p.reason}{after}"))
        wf.st.pending_tool_results = results
        raise
    wf.st.pending_tool_results = results
    submitted = wf.st.iteration > iteration_before
    if submitted:
        wf.st.turns_since_submission = 0
    repeated = llm_progress.repeats_answered(progress, res.tool_calls, results) if guarded else ""
    if repeated and not workflow.patched(REPEATS_PATCH):
        repeated = ""
    llm_progress.note_answered(progress, res.tool_calls, results, repeated, held=bool(submit_only) and not submitted)
    if llm_progress.note_turn(progress, submitted=submitted, executed=executed, submit_only=submit_only,
                              had_calls=bool(res.tool_calls)) and (guarded or not res.tool_calls):
        wf.llm_stopped_by = "exhausted"
        return True
    return _turn_budget_spent(wf)


def _turn_budget_spent(wf: Loop) -> bool:
    """A model that keeps turning without a new iteration (reading, re-submitting one source, talking)
    ends the run after turns_per_iteration turns, with stopped_by turn-budget."""
    if wf.st.turns_since_submission < wf.spec.turns_per_iteration:
        return False
    wf.llm_stopped_by = "turn-budget"
    wf.st.llm_progress.stop_reason = (f"no new iteration recorded in {wf.st.turns_since_submission} model turns "
                                      f"(turns_per_iteration {wf.spec.turns_per_iteration})")
    return True


def _known_sources(wf: Loop, call: ToolCall) -> str | None:
    """candidate_id -> source key, from what the workflow has seen: this run's records, the
    leaderboard, the best."""
    cid = call.candidate_id
    if not cid:
        return None
    if wf.st.best is not None and wf.st.best.candidate_id == cid:
        return wf.st.best.source_key
    for e in wf.st.leaderboard:
        if e.candidate_id == cid:
            return e.source_key
    for r in reversed(wf.records):
        if r.candidate_id == cid and r.source_key != "-":
            return r.source_key
    return None


def _answer(call: ToolCall, text: str, error: bool = False, key: str | None = None) -> ToolResult:
    return ToolResult(call_id=call.call_id, name=call.name, content=decisions.trim(text, _ANSWER_CHARS),
                      error=error, implicit=call.implicit, content_key=key)


async def _execute(wf: Loop, call: ToolCall) -> ToolResult:
    if call.error:
        return _answer(call, call.error, error=True)
    if call.name == "submit_kernel":
        return await _submit(wf, call)
    if call.source_key is None and call.candidate_id:
        key = _known_sources(wf, call)
        if key is None:
            return _answer(call, f"unknown candidate_id {call.candidate_id!r}: give the full `source` instead",
                           error=True)
        call = call.model_copy(update={"source_key": key})
    if call.name in ("compile", "check", "benchmark", "profile"):
        return await _gpu_tool(wf, call)
    res = await wf.agent("llm_tool", LlmToolRequest(problem=wf.spec.problem, call=call,
                                                     notebook_key=wf.st.notebook_key, best=wf.st.best),
                          ToolResult, minutes=2)
    return res.model_copy(update={"implicit": call.implicit})


async def _submit(wf: Loop, call: ToolCall) -> ToolResult:
    limit = decisions.limit_reached(wf.spec.budget, wf.st.used)
    if limit or wf.stop is not None:
        why = "the run is stopping" if wf.stop is not None else f"the budget is used up ({limit})"
        return _answer(call, f"not evaluated: {why}", error=True)
    for r in reversed(wf.records):
        if r.candidate_id == call.candidate_id:
            return _answer(call, f"this exact source was already evaluated as iteration {r.iteration}: "
                                 + _describe(r) + ". Change something before submitting again.", error=True)
    rationale = str(call.args.get("rationale") or "")[:300]
    cand = Candidate(candidate_id=call.candidate_id, source_key=call.source_key, rationale=rationale)
    # as recorded: acceptance may have turned "improved" into "passed"; with the run's patches decided at
    # its start, a new best's profile is taken beside its checks (the patch's own marker stays where it was)
    rec, taken = await wf.submit(cand, profile_if_crowned=wf.llm_patches_at_start)
    best = _best_line(wf.st.best)
    profile = ""
    if patch_on(wf, PROFILE_BESTS_PATCH):
        with_profile = decisions.profile_with_verdict(rec.outcome, rec.interpreter)
    else:  # histories recorded before: every timed submission's answer brought one
        with_profile = rec.outcome != "rejected" and not rec.interpreter
    if with_profile:
        profile = _profile_text(taken) if taken is not None else await _profile_line(
            wf, EvalRequest(problem=wf.spec.problem, candidate_id=rec.candidate_id, source_key=rec.source_key,
                            shape=wf.spec.shape))
    elif rec.outcome == "passed" and not rec.interpreter:
        profile = f"\nIts profile: call `profile` with candidate_id {rec.candidate_id}."
    return _answer(call, f"iteration {rec.iteration}: {_describe(rec)}. {best}.{profile}")


async def _profile_line(wf: Loop, ev: EvalRequest) -> str:
    """The profile summary a timed kernel's answer brings without being asked (on a GPU: bound,
    achieved bandwidth and FLOP rate, occupancy, registers, spills)."""
    try:
        p = await wf.gpu("profile_candidate", ev, ProfileReport, minutes=20)
    except Paused as e:
        return f"\nprofile: not available ({decisions.trim(e.reason, 200)})"
    return _profile_text(p)


def _profile_text(p: ProfileReport) -> str:
    return f"\nprofile ({p.tool or '-'}, {p.bound}-bound): {p.summary}" if p.ok else \
        f"\nprofile: failed ({decisions.trim(p.summary, 200)})"


def _host_note(r) -> str:
    """Host latency beside the device-time figures (BenchReport or IterationRecord): its own figure."""
    if r.host_ms is None:
        return ""
    base = f" (baseline {r.baseline_host_ms:.4g} ms)" if r.baseline_host_ms is not None else ""
    return f"; host latency of a synchronous call {r.host_ms:.4g} ms{base}, not part of the speedup"


def _distributions_note(b: BenchReport) -> str:
    """Each input distribution's device times; the worst speedup decides."""
    if not b.distributions:
        return ""
    return ("; by distribution (worst decides): " + ", ".join(
        f"{d.dist} {d.time_ms:.4g} vs {d.baseline_ms:.4g} ms {d.speedup:.3f}x" for d in b.distributions))


def _describe(r: IterationRecord) -> str:
    if r.outcome == "rejected":
        return f"rejected at {r.stage}: {r.reason}"
    if r.interpreter:
        err = f" (rel err {r.rel_err:.2g})" if r.rel_err is not None else ""
        return f"passed verification{err}; {INTERPRETER_VERDICT}"
    ci = f" [95% CI {r.speedup_ci[0]:.3f}-{r.speedup_ci[1]:.3f}]" if r.speedup_ci else ""
    worst = f" on {r.deciding_dist}, the worst distribution" if r.deciding_dist else ""
    return (f"{r.outcome}: {r.speedup:.3f}x{ci}{worst}, {r.time_ms:.4g} ms vs baseline {r.baseline_ms:.4g} ms, "
            f"rel err {r.rel_err:.2g}{_host_note(r)}" if r.rel_err is not None else
            f"{r.outcome}: {r.speedup:.3f}x{ci}{worst}, {r.time_ms:.4g} ms{_host_note(r)}")


def _best_line(b: BestRef | None) -> str:
    """The run's best in a submission's answer; under the interpreter without a speed (INTERPRETER_VERDICT)."""
    if b is None:
        return "no best yet"
    if b.interpreter:
        return f"current best: {b.candidate_id} (iteration {b.iteration})"
    return f"current best: {b.candidate_id} {b.speedup:.3f}x ({b.time_ms:.4g} ms)"


async def _gpu_tool(wf: Loop, call: ToolCall) -> ToolResult:
    if call.rules_error:
        return _answer(call, f"rejected by the rules before running: {call.rules_error}", error=True)
    ev = EvalRequest(problem=wf.spec.problem, candidate_id=call.candidate_id or "-", source_key=call.source_key,
                     shape=wf.spec.shape)
    if call.name == "compile":
        wf.set_phase("compiling")
        c = await wf.gpu("compile_candidate", ev, CompileReport, minutes=15)
        if not c.ok:
            return _answer(call, f"compile failed: {c.error}", error=True)
        facts = {k: getattr(c, k) for k in ("registers", "spills", "shared_bytes", "num_warps", "num_stages",
                                            "tensor_cores", "tma") if getattr(c, k) is not None}
        return _answer(call, f"compiled{' (interpreter)' if c.interpreter else ''}: kernels "
                             f"{', '.join(c.kernels) or '-'}; {facts}")
    if call.name == "check":
        wf.set_phase("verifying")
        v = await wf.gpu("verify_candidate", ev, VerifyReport, minutes=20)
        if not v.ok:
            return _answer(call, f"incorrect ({v.stage}): {v.reason}", error=True)
        return _answer(call, f"correct: worst rel err {v.rel_err:.3g} (threshold {v.threshold:.3g})"
                       if v.rel_err is not None and v.threshold is not None else "correct")
    if call.name == "benchmark":
        wf.set_phase("benchmarking")
        b = await wf.gpu("benchmark_candidate", ev.bench(best=wf.st.best), BenchReport,
                          minutes=20)
        wf.st.device_facts = b.device_facts or wf.st.device_facts
        wf.st.used.gpu_seconds += b.gpu_seconds
        if not b.ok:
            return _answer(call, f"benchmark failed ({b.stage}): {b.reason}", error=True)
        if b.interpreter:
            return _answer(call, f"ran under the interpreter; {INTERPRETER_VERDICT}. Not submitted: use "
                                 f"submit_kernel to make it count.")
        ci = f" [95% CI {b.speedup_ci[0]:.3f}-{b.speedup_ci[1]:.3f}]" if b.speedup_ci else ""
        vs = f"; current best re-timed {b.best_time_ms:.4g} ms" if b.best_time_ms else ""
        profile = await _profile_line(wf, ev)
        return _answer(call, f"{b.time_ms:.4g} ms vs baseline {b.baseline_name} {b.baseline_ms:.4g} ms: "
                             f"{b.speedup:.3f}x{ci}{vs}{_distributions_note(b)}{_host_note(b)}. "
                             f"Not submitted: use submit_kernel to make it count.{profile}")
    wf.set_phase("benchmarking")
    p = await wf.gpu("profile_candidate", ev, ProfileReport, minutes=20)
    return _answer(call, f"profile ({p.tool}, {p.bound}-bound): {p.summary}", error=not p.ok)
