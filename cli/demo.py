"""`marathon demo`: what `make run` does."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import datetime, timezone

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
    if server is not None:
        print(f"the dev server keeps running (pid {server.pid}) so the Web UI stays up; "
              f"stop it with: kill {server.pid}")
    return 0
