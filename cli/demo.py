"""`marathon demo`: what `make run` does."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import datetime, timezone

from cli.errors import UsageError
from cli.home import HOME
from cli.query import fmt_end, run_report, watch
from cli.run import cmd_start
from cli.server import register_search_attributes, start_dev_server
from cli.spec import parse_spec
from cli.workers import wait_for_worker


async def cmd_demo(args) -> int:
    """What `make run` does: dev server (reused if up), a worker, a run, progress, report."""
    from workflows.client import Unreachable, connect

    for k in ("policy", "population", "compact_every", "seed", "shape", "model", "hours", "tokens",
              "gpu_seconds", "gpu_queue", "spec"):
        setattr(args, k, getattr(args, k, None))
    if getattr(args, "local_model", False) and args.policy not in (None, "llm"):
        raise UsageError("--local-model serves a model for the llm policy: use it with --policy llm")
    if getattr(args, "local_model", False):
        args.policy = "llm"
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
    model = start_local_model() if getattr(args, "local_model", False) else None
    log = open(HOME / "worker.log", "ab")
    worker = subprocess.Popen([sys.executable, "-m", "cli", "worker", "--role", "all"],
                              stdout=log, stderr=log, start_new_session=True)
    try:
        args.id = args.id or f"marathon-{args.problem}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
        await cmd_start(args)
        print("Web UI: http://localhost:8233/namespaces/default/workflows/" + args.id, flush=True)
        await wait_for_worker(client, worker, HOME / "worker.log")
        res = await watch(client, args.id)
        print(fmt_end(res))
        print(f"report: {await run_report(client, args.id, None)}")
        if res.best is not None:
            print(f"the best kernel as a file: marathon export {args.id}")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        if model is not None:
            model.stop()
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
