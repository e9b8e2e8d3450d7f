"""The client side of a run: the connection to Temporal, the run's handle, its status or result, its spec."""

from __future__ import annotations

from workflows.contracts import AGENT_QUEUE, RunResult, RunSpec, Status
from cli.errors import UsageError
from cli.workers import agent_worker_missing


async def connect_client(args):
    from workflows.client import Unreachable, connect

    try:
        return await connect(getattr(args, "address", None), getattr(args, "namespace", None))
    except Unreachable as e:
        raise UsageError(str(e))


def run_handle(client, wid: str):
    return client.get_workflow_handle(wid, result_type=RunResult)


#: how long a query or update waits for a worker to answer: a live worker answers within a second or two; the
#: server goes on listing a worker's poller for a minute after it stops, and nothing answers then
ANSWER_TIMEOUT_S = 8.0


class RunFailed(UsageError):
    """The run ended without a result (failed, terminated, cancelled, timed out): one line saying why."""


async def query_run(client, wid: str, query, timeout: float = ANSWER_TIMEOUT_S):
    """One of the run's queries. Only a worker answers: where none polls the agent task queue, one line says
    so at once; where none answers within `timeout` (a worker that has just stopped), one line says that."""
    from datetime import timedelta

    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    missing = await agent_worker_missing(client)
    if missing:
        raise UsageError(f"run {wid!r}: {missing}")
    try:
        return await run_handle(client, wid).query(query, rpc_timeout=timedelta(seconds=timeout))
    except RPCError as e:
        if (e.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED)
                or "timeout expired" in e.message.lower()):
            # the same advice as where no worker polls at all: `--role agent` alone on a one-host setup leaves
            # the run's candidates with no GPU worker, and the run waits at "evaluating" without a word
            raise UsageError(f"run {wid!r}: no worker answered within {timeout:g} s (a worker polled task queue "
                             f"{AGENT_QUEUE} lately and may have stopped): start one with `marathon worker --role "
                             f"all` against this server (`--role agent` where GPU workers run elsewhere)")
        raise UsageError(f"cannot query run {wid!r}: {e.message}")
    except WorkflowQueryFailedError as e:
        raise UsageError(f"cannot query run {wid!r}: {e}")


async def query_status(client, wid: str, timeout: float = ANSWER_TIMEOUT_S) -> Status:
    """The run's `status` query (query_run)."""
    from workflows.optimization import KernelOptimization

    return await query_run(client, wid, KernelOptimization.status, timeout)


async def update_run(client, wid: str, update, arg, what: str, timeout: float = ANSWER_TIMEOUT_S):
    """One of the run's updates: only a worker takes it, so where none polls the agent task queue one line says so
    before anything is sent, and where none takes it within `timeout` one line says that."""
    from datetime import timedelta

    from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
    from temporalio.service import RPCError

    missing = await agent_worker_missing(client)
    if missing:
        raise UsageError(f"run {wid!r}: {missing}; nothing was changed")
    try:
        return await run_handle(client, wid).execute_update(update, arg, rpc_timeout=timedelta(seconds=timeout))
    except WorkflowUpdateFailedError as e:
        raise UsageError(f"{what} rejected: {e.cause.message if e.cause else e}")
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise UsageError(f"run {wid!r}: no worker took the {what} within {timeout:g} s (a worker polled task queue "
                         f"{AGENT_QUEUE} lately and may have stopped); `marathon status {wid}` shows whether it "
                         f"applied once one runs")
    except RPCError as e:
        raise UsageError(f"cannot update run {wid!r}: {e.message}")


async def run_spec_of(client, wid: str) -> RunSpec | None:
    """The spec the run's latest execution started with (its first history event): no worker needed.
    None when that input does not validate (such a run fails at once anyway)."""
    from temporalio.api.common.v1 import WorkflowExecution
    from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryRequest
    from temporalio.service import RPCError

    try:
        resp = await client.workflow_service.get_workflow_execution_history(GetWorkflowExecutionHistoryRequest(
            namespace=client.namespace, execution=WorkflowExecution(workflow_id=wid), maximum_page_size=1))
    except RPCError as e:
        raise UsageError(f"no run {wid!r}: {e.message}")
    try:
        payloads = resp.history.events[0].workflow_execution_started_event_attributes.input.payloads
        (raw,) = await client.data_converter.decode(payloads, [dict])
        return RunSpec.model_validate(raw)
    except (IndexError, ValueError, TypeError):
        return None


async def status_or_result(client, wid: str, prefer_query: bool = False):
    """The live status if the run is open, else its result (both carry the keys); RunFailed for a run that
    ended without one. With prefer_query a completed run answers the status query too, when a worker is up
    to answer it within a few seconds."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    h = run_handle(client, wid)
    try:
        desc = await h.describe()
    except RPCError as e:
        raise UsageError(f"no run {wid!r}: {e.message}")
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return await query_status(client, wid)
    if desc.status != WorkflowExecutionStatus.COMPLETED:  # failed at once, terminated, ...: no state to ask
        await run_result(client, wid)
    if prefer_query:
        try:
            return await query_status(client, wid)
        except UsageError:
            pass
    return await run_result(client, wid)


async def run_result(client, wid: str) -> RunResult:
    """The closed run's result, or RunFailed saying how it ended instead."""
    from temporalio.client import WorkflowFailureError

    try:
        return await run_handle(client, wid).result()
    except WorkflowFailureError as e:
        raise run_failed(wid, e) from None


def run_failed(wid: str, e) -> RunFailed:
    """How the run ended without a result (a WorkflowFailureError), in one line."""
    cause = e.cause
    how = {"TerminatedError": "was terminated", "CancelledError": "was cancelled",
           "TimeoutError": "timed out"}.get(type(cause).__name__, "failed")
    return RunFailed(f"run {wid} {how}: {getattr(cause, 'message', None) or cause or e}")
