"""The sandbox child process: `python -m gpu_worker.child FD_IN FD_OUT TMPDIR ROLE`.

ROLE is `candidate` (untrusted code is loaded into it, one candidate per process, then it exits) or
`reference` (trusted: oracle, baseline, ceilings, receipts; never loads candidate code).

The parent talks to the child through two pipes, in the typed messages of gpu_worker.protocol (plain
pickled values); the child's own stdout/stderr go to TMPDIR/log.txt, so whatever the candidate prints
cannot forge a reply. Everything the harness needs to time or hash (events, synchronize, perf_counter,
sha256, Tensor methods) is captured *before* the candidate loads (child.core.ChildCore), and every slot the
trusted code calls through is pinned then (gpu_worker.pins) and checked after every call of the candidate
and after every command.

This module is the process: its limits and its serving loop, which hands each request to the Server
(child.server, composed of the child's parts) by the dispatch table.
"""

from __future__ import annotations

import os
import sys
import time

from gpu_worker import protocol, wire
from gpu_worker.child.core import Refused
from gpu_worker.child.server import Server, serve
from gpu_worker.settings import CHILD_SETTINGS, GpuWorkerSettings


def _redirect(tmp: str) -> None:
    fd = os.open(os.path.join(tmp, "log.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def apply_limits(spec: str | None) -> None:
    """The limits the parent asks for (sandbox.Sandbox: MARATHON_CHILD_LIMITS, JSON), set by the child
    itself before anything else runs in it: no core dumps, the cores it may use, and an address-space
    cap where no CUDA mappings need the room (the interpreter)."""
    import json
    import resource

    if not spec:
        return
    lim = json.loads(spec)
    if lim.get("core") is not None:
        resource.setrlimit(resource.RLIMIT_CORE, (lim["core"], lim["core"]))
    if lim.get("cpus"):
        os.sched_setaffinity(0, lim["cpus"])
    if lim.get("address_space"):
        resource.setrlimit(resource.RLIMIT_AS, (lim["address_space"], lim["address_space"]))


def main(argv: list[str]) -> int:
    fd_in, fd_out, tmp, role = int(argv[0]), int(argv[1]), argv[2], argv[3]
    apply_limits(os.environ.pop("MARATHON_CHILD_LIMITS", None))
    guard_fd = os.environ.pop("MARATHON_GUARD_FD", None)  # the guard's reports, read by the worker
    settings = os.environ.pop(CHILD_SETTINGS, None)  # the worker's settings (gpu_worker.settings)
    _redirect(tmp)
    from multiprocessing.connection import Connection

    import pickle

    class _Out:  # plain pickle: torch's ForkingPickler reductions would share memory through sockets
        def __init__(self, c):
            self.c = c

        def send(self, obj):
            self.c.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    class _In:
        def __init__(self, c):
            self.c = c

        def recv(self):
            return pickle.loads(self.c.recv_bytes())

    cin = _In(Connection(fd_in, writable=False))
    cout = _Out(Connection(fd_out, readable=False))
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import triton  # noqa: F401

    server = Server(tmp, role, GpuWorkerSettings.from_child(settings))
    server.core.guard_fd = int(guard_fd) if guard_fd else None
    # held in this frame from before any candidate exists: after every command the slots the trusted code
    # calls are checked here too, by a check no candidate can rebind (gpu_worker.pins)
    pins, check, handle = server.pins, server.pins.check, serve
    cout.send(protocol.Ready(ready=True, cuda=server.cuda, pid=os.getpid(),
                             import_s=time.perf_counter() - t0).model_dump())
    while True:
        try:
            msg = cin.recv()
        except EOFError:
            return 0
        except Exception as e:  # noqa: BLE001 - bytes that are no pickle: refused like any malformed request
            cout.send(wire.reply_to_wire(None, failure=wire.Failure(
                kind="protocol", error=f"unreadable request: {type(e).__name__}: {e}")))
            continue
        seq = msg.get("seq") if isinstance(msg, dict) else None  # echoed: no reply is taken for another
        seq = seq if type(seq) is int else None
        try:
            request = wire.parse_request(msg)
        except wire.ProtocolError as e:
            cout.send(wire.reply_to_wire(seq, failure=wire.Failure(kind="protocol", error=str(e))))
            continue
        if isinstance(request, protocol.Exit):
            cout.send(wire.reply_to_wire(seq, protocol.Empty()))
            return 0
        result, failure = None, None
        try:
            result = handle(server, request)
        except Refused as e:
            failure = wire.Failure(kind=e.kind, error=e.error)
        except BaseException as e:  # noqa: BLE001 - every failure becomes a structured reply
            failure = server.describe_failure(e)
        violations = server.violations()
        seen = {detail for _, detail in violations}
        violations += [("escape", d) for d in (f"{pins.names.get(id(m), '?')}.{k} was rebound by the candidate"
                                               for m, k in check()) if d not in seen]
        try:
            cout.send(wire.reply_to_wire(seq, result, failure, violations))
        except Exception as e:  # noqa: BLE001 - a reply that does not serialise
            cout.send(wire.reply_to_wire(seq, failure=wire.Failure(
                kind="exception", error=f"reply could not be sent: {e}"), violations=violations))
        if failure is not None and failure.fatal:
            return 3
