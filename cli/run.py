"""The commands that act on a run: start, budget, stop, pause, resume, hint."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

from pydantic import ValidationError

from workflows.contracts import AGENT_QUEUE, BudgetChange, Hint, RunSpec, StopRequest, explain
from workflows.text import budget_text, run_summary
from cli.connection import connect_client, run_handle, run_spec_of, update_run
from cli.errors import UsageError
from cli.server import register_search_attributes
from cli.spec import check_hint, is_problem_path, parse_spec, search_space
from cli.workers import (FIRST_TASK_WAIT_S, check_workers_can_run, first_task_taken, gpu_worker_missing,
                         unserved_queues)


def temporal_hints(wid: str, spec: RunSpec, address: str | None = None, namespace: str | None = None) -> list[str]:
    """The plain temporal CLI's commands for this run: queries, budget, hint, pause, resume, stop."""
    import shlex

    conn = "".join(f" --{k} {shlex.quote(v)}" for k, v in (("address", address), ("namespace", namespace)) if v)
    if spec.policy == "search":
        space = search_space(spec)
        name = next(iter(space), None)
        hint = f"{name}={space[name][-1]}" if name else "try a smaller block"
    else:
        hint = "try a smaller block"
    wf = f"--workflow-id {shlex.quote(wid)}{conn}"
    q = shlex.quote
    return [f"temporal workflow query {wf} --name status",
            f"temporal workflow query {wf} --name leaderboard",
            f"temporal workflow update execute {wf} --name set_budget --input "
            + q(json.dumps({"iterations": spec.budget.iterations * 2} if spec.budget.iterations else {"hours": 24})),
            f"temporal workflow signal {wf} --name hint --input {q(json.dumps({'text': hint}))}",
            f"temporal workflow signal {wf} --name pause",
            f"temporal workflow signal {wf} --name resume",
            f"temporal workflow signal {wf} --name stop --input {q(json.dumps({'reason': 'done for today'}))}"]


async def cmd_start(args) -> int:
    spec = parse_spec(args)
    client = await connect_client(args)
    await check_workers_can_run(client, spec, args.problem if args.problem and is_problem_path(args.problem) else None)
    await register_search_attributes(client)
    name = spec.problem.replace(":", "-")[:19] if ":" in spec.problem else spec.problem  # a key: its start
    wid = args.id or f"marathon-{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    from temporalio.common import WorkflowIDReusePolicy
    from temporalio.exceptions import WorkflowAlreadyStartedError

    from workflows.optimization import KernelOptimization

    summary = run_summary(spec)
    try:
        # The static summary shows on the first execution only (continue-as-new cannot set one); the memo,
        # which continue-as-new carries, and every run's current details repeat it.
        await client.start_workflow(
            KernelOptimization.run, spec, id=wid, task_queue=AGENT_QUEUE,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE, memo={"summary": summary},
            static_summary=summary,
            static_details=f"```json\n{spec.model_dump_json(indent=1, exclude_none=True)}\n```")
    except WorkflowAlreadyStartedError:
        raise UsageError(f"a run with id {wid!r} already exists; pick another --id")
    print(wid)
    # on stderr, so that `ID=$(marathon start ...)` keeps the id alone
    print("the plain temporal CLI drives it too:\n  " + "\n  ".join(
        temporal_hints(wid, spec, getattr(args, "address", None), getattr(args, "namespace", None))),
        file=sys.stderr)
    if not getattr(args, "worker_follows", False):  # `marathon demo` starts its worker next
        unserved = await unserved_queues(client, spec)
        for line in unserved:
            print(f"warning: {line}", file=sys.stderr)
        agent_listed = not any(f"task queue {AGENT_QUEUE}:" in line for line in unserved)
        if agent_listed and not await first_task_taken(client, wid):
            print(f"warning: no worker took this run's first task within {FIRST_TASK_WAIT_S:g} s: the workers the "
                  f"server lists on task queue {AGENT_QUEUE} may have stopped; nothing runs this run until one "
                  f"starts (`marathon worker --role all`)", file=sys.stderr)
    return 0


async def cmd_budget(args) -> int:
    fields = {k: getattr(args, k) for k in ("iterations", "hours", "tokens", "gpu_seconds")
              if getattr(args, k) is not None}
    if not fields and getattr(args, "context_tokens", None) is None:
        raise UsageError("budget needs at least one of --iterations, --hours, --tokens, --gpu-seconds, "
                         "--context-tokens")
    if getattr(args, "context_tokens", None) is not None:
        await _set_context_tokens(args)
        if not fields:
            return 0
    try:
        BudgetChange(**fields)
    except ValidationError as e:
        raise UsageError(f"invalid budget: {explain(e)}")
    client = await connect_client(args)
    from workflows.optimization import KernelOptimization

    # only the fields given: a BudgetChange would be sent with every other field null, and null clears
    budget = await update_run(client, args.id, KernelOptimization.set_budget, fields, "budget change")
    print(f"budget now {budget_text(budget)}")
    return 0


async def _set_context_tokens(args) -> None:
    """llm policy: the prompt's size cap of a running run (the `set_context_tokens` update)."""
    from workflows.optimization import KernelOptimization

    client = await connect_client(args)
    n = await update_run(client, args.id, KernelOptimization.set_context_tokens, args.context_tokens,
                         "context_tokens change")
    print(f"context_tokens now {n}")


async def _signal(args, name: str, arg=None) -> int:
    client = await connect_client(args)
    from temporalio.service import RPCError

    try:
        h = run_handle(client, args.id)
        await (h.signal(name, arg) if arg is not None else h.signal(name))
    except RPCError as e:
        raise UsageError(f"cannot signal run {args.id!r}: {e.message}")
    print(f"{name} sent to {args.id}")
    return 0


async def _note_unserved(args, what: str, instead: str) -> None:
    """One note where no GPU worker polls the run's queue: `what` waits for the evaluations under way, and
    nothing runs them; `instead`: what does not wait."""
    client = await connect_client(args)
    spec = await run_spec_of(client, args.id)
    missing = await gpu_worker_missing(client, spec.gpu_queue) if spec is not None else None
    if missing:
        print(f"note: {missing}; the {what} waits for the evaluations under way until then: {instead}",
              file=sys.stderr)


async def cmd_stop(args) -> int:
    rc = await _signal(args, "stop", StopRequest(reason=args.reason, now=args.now))
    if not args.now:
        await _note_unserved(args, "stop", f"`marathon stop {args.id} --now` cancels them")
    return rc


async def cmd_pause(args) -> int:
    rc = await _signal(args, "pause")
    await _note_unserved(args, "pause", f"`marathon stop {args.id} --now` ends the run without them")
    return rc


async def cmd_resume(args) -> int:
    return await _signal(args, "resume")


async def cmd_hint(args) -> int:
    try:
        h = Hint(text=args.text)
    except ValidationError as e:
        raise UsageError(f"invalid hint: {explain(e)}")
    client = await connect_client(args)
    spec = await run_spec_of(client, args.id)
    if spec is not None and spec.policy == "search":
        check_hint(spec, h.text)
    return await _signal(args, "hint", h)
