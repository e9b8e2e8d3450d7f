"""The end of a run's execution: the notebook's compaction (before continue-as-new and at the end), and the
finish: the best verified again after a stop, the result.

Deterministic: activity calls and arithmetic on the loop's state, handed in as `wf` (the KernelOptimization
instance; this module imports the workflow's module nowhere).
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import run_view
    from workflows.contracts import CompactRequest, CompactResult, EvalRequest, RunResult, VerifyReport
    from workflows.evaluation import Interrupted, Paused


async def compact(wf, final: bool, stopped_by: str | None = None) -> None:
    """This execution's records into the ledger and the notebook; a failing compaction pauses the run until
    the operator resumes it (it must happen before continue-as-new)."""
    wf.set_phase("compacting")
    st = wf.st
    req = CompactRequest(workflow_id=workflow.info().workflow_id, problem=wf.spec.problem, policy=wf.spec.policy,
                         model=wf.spec.model, run=st.runs, records=wf.records, notebook_key=st.notebook_key,
                         notebook_version=st.notebook_version, ledger_key=st.ledger_key, best=st.best, final=final,
                         adapted=st.llm_adapted, hints=st.llm_hints, conversation_key=st.conversation_key,
                         tool_results=st.pending_tool_results, stopped_by=stopped_by)
    while True:
        try:
            res = await wf.agent("compact_notebook", req, CompactResult, minutes=10)
            break
        except Paused as p:
            wf.pause_for(p.reason)
            wf.set_phase("paused")
            await wf.wait_paused(lambda: not wf.st.paused)
            wf.set_phase("compacting")
    st.notebook_key, st.notebook_version = res.notebook_key, res.notebook_version
    st.ledger_key = res.ledger_key
    st.used.tokens_in += res.tokens_in
    st.used.tokens_out += res.tokens_out
    wf.records = []


async def finish(wf, stopped_by: str) -> RunResult:
    """After a stop the best is verified again (not after a stop with `now`), the last records compacted."""
    reverified = None
    if wf.st.best is not None and stopped_by == "stop-signal" and not wf.stopping_now():
        wf.set_phase("reverifying")
        reverified = await reverify_best(wf)
    if wf.records or wf.st.ledger_key is None:
        await compact(wf, final=True, stopped_by=stopped_by)
    wf.account_time()
    wf.finished = True
    wf.set_phase("done")
    await workflow.wait_condition(workflow.all_handlers_finished)
    return run_view.result(workflow.info().workflow_id, wf.spec, wf.st, stopped_by, wf.stop, reverified,
                           wf.cancelled)


async def reverify_best(wf) -> bool | None:
    """The best verified once more; None where a stop with `now` cancelled it."""
    b = wf.st.best
    ev = EvalRequest(problem=wf.spec.problem, candidate_id=b.candidate_id, source_key=b.source_key,
                     shape=wf.spec.shape)
    try:
        ver = await wf.gpu("verify_candidate", ev, VerifyReport, minutes=20)
        return ver.ok
    except Interrupted:
        return None
    except Paused:
        return False
