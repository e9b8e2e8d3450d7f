"""The commands that read a run: status, watch, report, notebook, export."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from workflows.contracts import RunResult
from workflows.text import INTERPRETER_NOTE, best_text, budget_text, record_text, used_text
from cli.connection import (RunFailed, connect_client, query_run, query_status, run_failed, run_handle, run_result,
                            status_or_result)
from cli.errors import UsageError
from cli.llm_view import TurnPrinter, endpoint_trouble, turn_lines
from cli.home import HOME


def fmt_best(best) -> str:
    return "-" if best is None else best_text(best)


def fmt_last(last) -> str:
    return "-" if last is None else record_text(last)


def fmt_end(res: RunResult) -> str:
    why = res.stopped_by + (f" ({res.stop_reason})" if res.stop_reason else "")
    return f"done: {res.iterations} iterations, stopped by {why}, best {fmt_best(res.best)}"


async def cmd_status(args) -> int:
    client = await connect_client(args)
    # the query first, finished runs too (scripts read its fields); without a worker a finished run's result
    try:
        st = await status_or_result(client, args.id, prefer_query=True)
    except RunFailed as e:  # ended without a result: said on stdout as the status, exit status 1
        print(json.dumps({"workflow_id": args.id, "failed": str(e)}, indent=2) if args.json else str(e))
        return 1
    if args.json:
        print(st.model_dump_json(indent=2))
        return 0
    if isinstance(st, RunResult):
        print(f"{st.workflow_id}: {st.problem} finished after {st.iterations} iterations, run {st.runs}")
        print(f"stopped by {st.stopped_by}" + (f" ({st.stop_reason})" if st.stop_reason else ""))
        print(f"best: {fmt_best(st.best)}")
        print(f"used: {used_text(st.used, st.used.turns > 0)}")
        if st.best and st.best.interpreter:
            print(f"note: {INTERPRETER_NOTE}")
        return 0
    print(headline(st))
    if st.phase == "done":  # why it ended: the result says
        try:
            res = await asyncio.wait_for(run_result(client, args.id), 10)
            print(f"stopped by {res.stopped_by}" + (f" ({res.stop_reason})" if res.stop_reason else ""))
        except (asyncio.TimeoutError, UsageError):
            if st.stop_reason is not None:
                print(f"stopped: {st.stop_reason}")
    elif st.stop_reason is not None:
        print(f"stopping: {st.stop_reason}")
    print(f"best: {fmt_best(st.best)}")
    print(f"budget: {budget_text(st.budget)}; used: {used_text(st.used, st.policy == 'llm')}")
    print(f"last: {fmt_last(st.last)}")
    for refused in st.refused:  # signals the run did not apply (the plain temporal CLI gets no answer)
        print(f"refused: {refused}")
    unserved = await unserved_gpu_queue(client, st)
    if unserved:
        print(f"waiting: {unserved}")
    if st.llm is not None:  # the model's latest turn, and an endpoint failing it
        for line in (turn_lines(st.llm.turns[-1], st.paused) if st.llm.turns else []):
            print(line)
        trouble = endpoint_trouble(await run_handle(client, args.id).describe(), _asked_at(st))
        if trouble:
            print(trouble)
    if (st.best and st.best.interpreter) or (st.last and st.last.interpreter):
        print(f"note: {INTERPRETER_NOTE}")
    return 0


def headline(st) -> str:
    """`ID: problem (policy) iteration N, phase P, run R`, with why it pauses while it does. A run stopped while
    paused keeps its pause flag in the state, but a finished run is no longer paused."""
    paused = st.paused and st.phase != "done"
    return (f"{st.workflow_id}: {st.problem} ({st.policy}) iteration {st.iteration}, phase {st.phase}"
            f"{' (paused: ' + st.pause_reason + ')' if paused else ''}, run {st.runs}")


async def unserved_gpu_queue(client, st) -> str | None:
    """While a run goes on: one line where no GPU worker polls its GPU queue (None otherwise)."""
    from cli.workers import gpu_worker_missing

    if st.phase == "done" or st.paused or not st.gpu_queue:
        return None
    return await gpu_worker_missing(client, st.gpu_queue)


def _asked_at(st) -> float | None:
    """When the turn the model has not answered yet was asked."""
    turns = st.llm.turns if st.llm is not None else []
    return turns[-1].asked_at if turns and not turns[-1].replied else None


#: how often watch asks whether a GPU worker polls the run's GPU queue
GPU_QUEUE_CHECK_S = 15.0


async def watch(client, wid: str, interval: float = 1.0, out=sys.stdout) -> RunResult:
    """Print a table row whenever the iteration or phase changes, and for an llm run each model turn as it
    happens (its tools, their verdicts, its tokens) and an endpoint failing a turn; return the result at
    the end. While no worker answers, one line on stderr says so and what starts one."""
    from temporalio.client import WorkflowExecutionStatus

    from temporalio.service import RPCError

    h = run_handle(client, wid)
    try:
        await h.describe()
    except RPCError as e:
        raise UsageError(f"no run {wid!r}: {e.message}")
    print(f"{'iter':>5} {'phase':<13} {'best':<58} last result", file=out)
    seen, noted, waiting, turns, trouble = None, False, None, TurnPrinter(), None
    unserved, checked = None, 0.0  # the GPU queue's line, and when its pollers were last asked for
    while True:
        desc = await h.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            break
        try:
            st = await query_status(client, wid)
        except UsageError as e:  # no worker right now: the run waits for one, and so does watch
            if str(e) != waiting:
                waiting = str(e)
                print(f"waiting: {waiting}", file=sys.stderr, flush=True)
            await asyncio.sleep(interval)
            continue
        waiting = None
        if time.monotonic() - checked >= GPU_QUEUE_CHECK_S:  # the server's poller list, not every poll
            checked = time.monotonic()
            line = await unserved_gpu_queue(client, st)
            if line and line != unserved:
                print(f"waiting: {line}", file=sys.stderr, flush=True)
            unserved = line
        row = (st.iteration, st.phase, st.paused)
        if row != seen:
            seen = row
            if not noted and st.last is not None and st.last.interpreter:
                noted = True
                print(f"note: {INTERPRETER_NOTE}", file=out)
            phase = "paused" if st.paused else st.phase
            print(f"{st.iteration:>5} {phase:<13} {fmt_best(st.best):<58} {fmt_last(st.last)}", file=out,
                  flush=True)
            if st.paused:
                print(f"      paused: {st.pause_reason or 'by a pause signal'}; `marathon resume {wid}` goes on",
                      file=out, flush=True)
        if st.llm is not None:
            for line in turns.new_lines(st.llm.turns, time.time(), st.paused):
                print(f"      {line}", file=out, flush=True)
            # only while a turn waits: a describe read after the status can still hold a turn the status
            # shows answered (its attempt line would repeat the last one, without its "since")
            asked = _asked_at(st)
            now = endpoint_trouble(desc, asked) if asked else None
            failed = now.rsplit("; attempt", 1)[0] if now else None  # the same while its next attempt runs
            if failed and failed != trouble:  # once per failed attempt
                print(f"      {now}", file=out, flush=True)
            trouble = failed
        await asyncio.sleep(interval)
    res = await h.result()
    for line in await _turns_since_last_poll(client, wid, turns):
        print(f"      {line}", file=out, flush=True)
    if seen is None or seen[0] != res.iterations:  # the run ended between two polls: its last row
        print(f"{res.iterations:>5} {'done':<13} {fmt_best(res.best):<58} {fmt_last(_last_record(res))}", file=out,
              flush=True)
    return res


async def _turns_since_last_poll(client, wid: str, turns: TurnPrinter) -> list[str]:
    """The lines of the turns a finished run made after watch's last poll (a run that ends between two polls,
    or all of it on a fast endpoint): from its status, which a worker still answers for a while; [] where
    none does, or for a search run."""
    try:
        st = await query_status(client, wid, timeout=3)
    except UsageError:
        return []
    return turns.new_lines([v for v in st.llm.turns if v.replied], time.time()) if st.llm is not None else []


def _last_record(res: RunResult):
    """The run's last recorded iteration, from its ledger; None where the artifact store cannot be read here."""
    from activities.ledger import read_ledger
    from workflows.artifacts import ArtifactStore, ArtifactStoreError

    try:
        records = read_ledger(ArtifactStore(), res.ledger_key) if res.ledger_key else []
    except (ArtifactStoreError, OSError, ValueError):
        return None
    return records[-1] if records else None


async def cmd_watch(args) -> int:
    client = await connect_client(args)
    from temporalio.client import WorkflowFailureError

    try:
        res = await watch(client, args.id)
    except WorkflowFailureError as e:  # as `status` says it: on stdout, exit status 1
        print(run_failed(args.id, e))
        return 1
    print(fmt_end(res))
    return 0


async def cmd_report(args) -> int:
    client = await connect_client(args)
    path = await run_report(client, args.id, Path(args.out) if args.out else None)
    print(path)
    return 0


async def cmd_notebook(args) -> int:
    client = await connect_client(args)
    from workflows.artifacts import ArtifactStore

    st = await status_or_result(client, args.id)
    if not st.notebook_key:
        raise UsageError(f"run {args.id} has no notebook yet (written at the first compaction)")
    text = ArtifactStore().get_text(st.notebook_key)
    if args.version is not None:
        while args.version != _notebook_version(text):
            prev = _previous_key(text)
            if not prev:
                raise UsageError(f"run {args.id} has no notebook version {args.version}")
            text = ArtifactStore().get_text(prev)
    print(text)
    return 0


def _notebook_version(text: str) -> int | None:
    first = text.splitlines()[0] if text else ""
    return int(first.rsplit("version", 1)[1]) if "version" in first else None


def _previous_key(text: str) -> str | None:
    for line in text.splitlines()[:5]:
        if line.startswith("previous version:"):
            v = line.split(":", 1)[1].strip()
            return None if v == "none" else v
    return None


async def run_report(client, wid: str, out: Path | None) -> Path:
    """`marathon report`: Markdown and plots of the run, into `out` (default MARATHON_HOME/reports/ID)."""
    from activities.report import write_report

    # a live run's newest records are not in the ledger yet; asked first, so that a compaction between the two
    # queries moves records into the ledger the status names (they are merged by iteration) and none is lost
    unledgered = await _unledgered(client, wid)
    return write_report(await status_or_result(client, wid), wid, out or HOME / "reports" / wid, unledgered)


async def _unledgered(client, wid: str) -> list:
    """The open run's records not yet in its ledger; none for a closed run (its result's ledger has them all)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    from workflows.optimization import KernelOptimization

    try:
        if (await run_handle(client, wid).describe()).status != WorkflowExecutionStatus.RUNNING:
            return []
    except RPCError as e:
        raise UsageError(f"no run {wid!r}: {e.message}")
    return await query_run(client, wid, KernelOptimization.unledgered)


async def cmd_export(args) -> int:
    """The crowned best kernel as a standalone file with its receipt (cli/export.py)."""
    from workflows.artifacts import ArtifactStore
    from cli.export import ExportError, export_run

    client = await connect_client(args)
    st = await status_or_result(client, args.id)
    out = Path(args.out) if args.out else Path(f"export-{args.id}")
    try:
        if args.out == "-":  # the kernel file alone, on stdout
            with tempfile.TemporaryDirectory() as tmp:
                export_run(args.id, st, Path(tmp))
                sys.stdout.write((Path(tmp) / "kernel.py").read_text())
            return 0
        written = export_run(args.id, st, out, force=args.force)
    except ExportError as e:
        raise UsageError(str(e))
    receipt = json.loads((out / "receipt.json").read_text())
    print(f"{out / 'kernel.py'}: {st.problem} best, {best_text(st.best)}")
    print(f"receipt: {out / 'receipt.json'}, {out / 'receipt.md'} ({len(written)} files written)")
    print(f"re-verify: {receipt['verify_command']}")
    return 0
