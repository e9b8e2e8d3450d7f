"""The client side of a run: the connection to Temporal, the run's handle, its status or result, its spec."""

from __future__ import annotations

from workflows.contracts import RunResult, RunSpec, Status
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


async def query_status(client, wid: str, timeout: float | None = None) -> Status:
    """The run's `status` query. Only a worker answers it: where none polls the agent task queue, one line
    says so at once instead of the query's time-out."""
    from datetime import timedelta

    from temporalio.service import RPCError, RPCStatusCode

    from workflows.optimization import KernelOptimization

    missing = await agent_worker_missing(client)
    if missing:
        raise UsageError(f"run {wid!r}: {missing}")
    try:
        return await run_handle(client, wid).query(
            KernelOptimization.status, rpc_timeout=timedelta(seconds=timeout) if timeout else None)
    except RPCError as e:
        if e.status == RPCStatusCode.DEADLINE_EXCEEDED or "timeout expired" in e.message.lower():
            raise UsageError(f"run {wid!r}: no worker answered its status query in time; is a worker running "
                             f"against this server (`marathon worker --role agent`)?")
        raise UsageError(f"cannot query run {wid!r}: {e.message}")


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
    """The live status if the run is open, else its result (both carry the keys). With prefer_query a
    finished run answers the status query too, when a worker is up to answer it within a few seconds."""
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
    from temporalio.service import RPCError

    h = run_handle(client, wid)
    try:
        desc = await h.describe()
    except RPCError as e:
        raise UsageError(f"no run {wid!r}: {e.message}")
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return await query_status(client, wid)
    if prefer_query:
        try:
            return await query_status(client, wid, timeout=5)
        except UsageError:
            pass
    try:
        return await h.result()
    except WorkflowFailureError as e:
        raise UsageError(f"run {wid} did not complete: {e.cause or e}")
