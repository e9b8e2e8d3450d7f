"""The sandbox child process: `python -m gpu_worker.child FD_IN FD_OUT TMPDIR ROLE`.

ROLE is `candidate` (untrusted code is loaded into it, one candidate per process, then it exits) or
`reference` (trusted: oracle, baseline, ceilings, receipts; never loads candidate code).

The parent talks to the child through two pipes, in the typed messages of gpu_worker.protocol (plain
pickled values); the child's own stdout/stderr go to TMPDIR/log.txt, so whatever the candidate prints
cannot forge a reply. Everything the harness needs to time or hash (events, synchronize, perf_counter,
sha256, Tensor methods) is captured *before* the candidate loads (child_core.ChildCore), and every slot the
trusted code calls through is pinned then (gpu_worker.pins) and checked after every call of the candidate
and after every command.

This module is the process: its limits, its serving loop, the Server composed of the child's parts and
the dispatch table (`COMMANDS`) from each request type to the Server's command. The parts live by
concern: child_core (context, memory, violations), child_inputs, child_loading (load and compile),
child_verify (verification checks), child_exports (output files and fingerprints), child_timing,
child_profile and child_reference (the reference role).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

from gpu_worker import protocol
from gpu_worker.child_core import ChildCore, Refused, compared_outputs  # noqa: F401 - compared_outputs: re-exported
from gpu_worker.child_exports import ChildExports
from gpu_worker.child_inputs import ChildInputs
from gpu_worker.child_loading import ChildLoading
from gpu_worker.child_profile import ChildProfiling
from gpu_worker.child_reference import ChildReference
from gpu_worker.child_timing import ChildTiming, TimingSet
from gpu_worker.child_verify import ChildVerification
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
            cout.send(protocol.reply_to_wire(None, failure=protocol.Failure(
                kind="protocol", error=f"unreadable request: {type(e).__name__}: {e}")))
            continue
        seq = msg.get("seq") if isinstance(msg, dict) else None  # echoed: no reply is taken for another
        seq = seq if type(seq) is int else None
        try:
            request = protocol.parse_request(msg)
        except protocol.ProtocolError as e:
            cout.send(protocol.reply_to_wire(seq, failure=protocol.Failure(kind="protocol", error=str(e))))
            continue
        if isinstance(request, protocol.Exit):
            cout.send(protocol.reply_to_wire(seq, protocol.Empty()))
            return 0
        result, failure = None, None
        try:
            result = handle(server, request)
        except Refused as e:
            failure = protocol.Failure(kind=e.kind, error=e.error)
        except BaseException as e:  # noqa: BLE001 - every failure becomes a structured reply
            failure = server.describe_failure(e)
        violations = server.violations()
        seen = {detail for _, detail in violations}
        violations += [("escape", d) for d in (f"{pins.names.get(id(m), '?')}.{k} was rebound by the candidate"
                                               for m, k in check()) if d not in seen]
        try:
            cout.send(protocol.reply_to_wire(seq, result, failure, violations))
        except Exception as e:  # noqa: BLE001 - a reply that does not serialise
            cout.send(protocol.reply_to_wire(seq, failure=protocol.Failure(
                kind="exception", error=f"reply could not be sent: {e}"), violations=violations))
        if failure is not None and failure.fatal:
            return 3


def serve(server: "Server", request: protocol.Request) -> protocol.Result:
    """One request, by the dispatch table: its handler gets the request's fields as arguments."""
    handler = COMMANDS[type(request)]
    return handler(server, **{name: getattr(request, name) for name in type(request).model_fields})


class Server:
    """One child's command handlers, each part an object of its own built with exactly what it uses: the
    shared `core` (child_core.ChildCore: trusted references, pins, context, problem, loaded candidate), its
    `inputs` (child_inputs), `exports` (child_exports: output files, fingerprints), `loading` (child_loading:
    load, compile, the guarded call), `timing` (child_timing: preparation, timing sets, timed blocks),
    `profiling` (child_profile), `verification` (child_verify) and the `reference` role's (child_reference).
    The commands delegate. In a candidate's child every part, and which of them each holds, is pinned by
    identity before the candidate loads (ChildCore.pin_trusted)."""

    def __init__(self, tmp: str, role: str, settings=None):
        """`settings`: the worker's GpuWorkerSettings, as the child's channel carried them (main)."""
        self.core = core = ChildCore(tmp, role, settings)
        self.inputs = ChildInputs(core)
        self.exports = ChildExports(core, self.inputs)
        self.loading = ChildLoading(core, self.inputs)
        self.timing = ChildTiming(core, self.inputs, self.exports, self.loading)
        self.profiling = ChildProfiling(core, self.timing)
        self.verification = ChildVerification(core, self.inputs, self.loading, self.exports, self.timing)
        self.reference = ChildReference(core, self.inputs, self.timing)
        if role == "candidate":
            core.pin_trusted(self, {name: getattr(self, name) for name in PARTS}, state_classes=(TimingSet,))

    @property
    def cuda(self) -> bool:
        return self.core.cuda

    @property
    def pins(self):
        return self.core.pins

    def violations(self) -> list:
        return self.core.violations()

    def describe_failure(self, e: BaseException) -> protocol.Failure:
        return self.core.describe_failure(e)

    def cmd_cuda_init(self):
        return self.core.cmd_cuda_init()

    def cmd_warm_triton(self):
        return self.core.cmd_warm_triton()

    def cmd_stage(self, cases: list):
        return self.inputs.cmd_stage(cases, uncached=self.reference._stage_cached)

    def cmd_load(self, **request):
        return self.loading.cmd_load(**request)

    def cmd_compile(self, dist: str):
        return self.loading.cmd_compile(dist)

    def cmd_prepare(self, **request):
        return self.timing.cmd_prepare(**request)

    def cmd_verify(self, **request):
        return self.verification.cmd_verify(**request)

    def cmd_write_exports(self):
        return self.exports.cmd_write_exports()

    def cmd_capture(self, dist: str | None = None):
        return self.timing.cmd_capture(dist)

    def cmd_time(self, **request):
        return self.timing.cmd_time(**request)

    def cmd_host_latency(self, **request):
        return self.timing.cmd_host_latency(**request)

    def cmd_park(self):
        return self.timing.cmd_park()

    def cmd_profile(self, **request):
        return self.profiling.cmd_profile(**request)

    def cmd_setup(self, problem: str, shape: str | None):
        return self.reference.cmd_setup(problem, shape)

    def cmd_reference(self, **request):
        return self.reference.cmd_reference(**request)

    def cmd_compare(self, jobs: list):
        return self.reference.cmd_compare(jobs)

    def cmd_compare_timed(self, **request):
        return self.reference.cmd_compare_timed(**request)

    def cmd_ceilings(self):
        return self.reference.cmd_ceilings()

    def cmd_receipt(self):
        return self.reference.cmd_receipt()


#: the Server's parts, by attribute name (each pinned in a candidate's child)
PARTS = ("core", "inputs", "exports", "loading", "timing", "profiling", "verification", "reference")

COMMANDS: dict[type[protocol.Request], Callable[..., protocol.Result]] = {
    protocol.CudaInit: Server.cmd_cuda_init,
    protocol.WarmTriton: Server.cmd_warm_triton,
    protocol.Stage: Server.cmd_stage,
    protocol.Load: Server.cmd_load,
    protocol.Compile: Server.cmd_compile,
    protocol.Prepare: Server.cmd_prepare,
    protocol.Verify: Server.cmd_verify,
    protocol.WriteExports: Server.cmd_write_exports,
    protocol.Capture: Server.cmd_capture,
    protocol.Time: Server.cmd_time,
    protocol.HostLatencyRequest: Server.cmd_host_latency,
    protocol.Park: Server.cmd_park,
    protocol.Profile: Server.cmd_profile,
    protocol.Setup: Server.cmd_setup,
    protocol.Reference: Server.cmd_reference,
    protocol.Compare: Server.cmd_compare,
    protocol.CompareTimed: Server.cmd_compare_timed,
    protocol.MeasureCeilings: Server.cmd_ceilings,
    protocol.Receipt: Server.cmd_receipt,
}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
