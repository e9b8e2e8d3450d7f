"""`marathon demo`: what `make run` does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timezone

from cli.errors import UsageError
from cli.home import HOME
from cli.query import fmt_end, run_report, watch
from cli.run import cmd_start
from cli.server import demo_server, register_search_attributes, stop_server, ui_port_of
from cli.spec import parse_spec
from cli.workers import shared_agent_queue, wait_for_worker

#: the Web UI's list filtered to the runs, without their per-candidate evaluations (URL-encoded query)
RUNS_QUERY = "WorkflowType%3D%22KernelOptimization%22"


def worker_env(problem: str, environ) -> dict:
    """The demo's worker's environment: `environ`, where unset there, its running activities given 20 s to
    finish when the demo ends (within the 30 s it is waited for) and a built-in problem warmed as it starts
    (MARATHON_WARM_PROBLEM: its ceilings, oracles and the baseline's first call, before the first candidate
    has compiled)."""
    from baselines.registry import problem_names

    env = {**environ, "MARATHON_SHUTDOWN_GRACE_S": environ.get("MARATHON_SHUTDOWN_GRACE_S", "20")}
    if problem in problem_names() and "MARATHON_WARM_PROBLEM" not in environ:
        env["MARATHON_WARM_PROBLEM"] = problem
    return env


async def cmd_demo(args) -> int:
    """What `make run` does: a dev server (demo_server says which), a worker, a run, progress, report. The dev
    server stays up for the Web UI once the run has started; the worker stops with the demo."""
    from temporalio.envconfig import ClientConfig

    for k in ("policy", "population", "compact_every", "seed", "shape", "model", "hours", "tokens",
              "gpu_seconds", "gpu_queue", "spec"):
        setattr(args, k, getattr(args, k, None))
    if getattr(args, "local_model", False) and args.policy not in (None, "llm"):
        raise UsageError("--local-model serves a model for the llm policy: use it with --policy llm")
    if getattr(args, "local_model", False):
        args.policy = "llm"
    spec = parse_spec(args)  # bad input is refused before a server or worker starts
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: the worker is stopped on the way out
    HOME.mkdir(parents=True, exist_ok=True)
    address = args.address or ClientConfig.load_client_connect_config().get("target_host")
    client, server, ui, said = await demo_server(address, args.namespace, args.port,
                                                 ui_port_of(args.port, args.ui_port), HOME / "temporal.db",
                                                 HOME / "dev-server.log")
    print(said, flush=True)
    target, started, model, worker = client.service_client.config.target_host, False, None, None
    try:
        await register_search_attributes(client)
        model = start_local_model() if getattr(args, "local_model", False) else None
        shared = await shared_agent_queue(client) if model is not None else None
        if shared:
            print(f"warning: {shared}", flush=True)
        log = open(HOME / "worker.log", "ab")
        worker = subprocess.Popen([sys.executable, "-m", "cli", "worker", "--role", "all", "--address", target,
                                   "--namespace", client.namespace], stdout=log, stderr=log, start_new_session=True,
                                  env=worker_env(spec.problem, os.environ))
        await wait_for_worker(client, worker, HOME / "worker.log", spec)
        args.id = args.id or f"marathon-{args.problem}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
        args.address = target
        await cmd_start(args)
        started = True
        if ui:
            print(f"Web UI: {ui}/namespaces/{client.namespace}/workflows/{args.id} (its progress: the evaluations' "
                  f"rows on its Timeline, the details on its User Metadata tab); the runs alone: "
                  f"{ui}/namespaces/{client.namespace}/workflows?query={RUNS_QUERY}", flush=True)
        res = await watch(client, args.id)
        print(fmt_end(res))
        print(f"report: {await run_report(client, args.id, None)}")
        if res.best is not None:
            print(f"the best kernel as a file: marathon export {args.id}")
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        if model is not None:
            model.stop()
        if server is not None and not started:
            stop_server(server)  # nothing ran on it: the demo leaves no server behind
    print(f"the demo's worker has stopped: a run started now needs a worker (`marathon worker --role all --address "
          f"{target}`) where no other polls this server")
    if server is not None:
        print(f"the dev server keeps running (pid {server.pid}) so the Web UI stays up; "
              f"stop it with: kill {server.pid}")
    return 0


def start_local_model():
    """The local model server for the worker this demo starts: its endpoint goes into the environment
    the worker inherits."""
    import os

    from cli.local_model import LocalModel, LocalModelError

    HOME.mkdir(parents=True, exist_ok=True)
    log = HOME / "local-model.log"
    print(f"starting the local model server (SmolLM2-135M-Instruct, llama-cpp-python; log {log})", flush=True)
    try:
        model = LocalModel(log=log).start()
    except LocalModelError as e:
        raise UsageError(str(e)) from None
    os.environ.update(model.env())
    print(f"model endpoint {model.url}", flush=True)
    return model
