"""A sandbox child's `Server`, composed of the child's parts, and the dispatch table (`COMMANDS`) from each
request type to the Server's command; `serve` runs one request. The parts live by concern: core (context,
memory, violations, pins), inputs, loading (load and compile), verify (verification checks), exports
(output files and fingerprints), timing, profile and reference (the reference role)."""

from __future__ import annotations

from typing import Callable

from gpu_worker import protocol, wire
from gpu_worker.child.core import ChildCore
from gpu_worker.child.exports import ChildExports
from gpu_worker.child.inputs import ChildInputs
from gpu_worker.child.loading import ChildLoading
from gpu_worker.child.profile import ChildProfiling
from gpu_worker.child.reference import ChildReference
from gpu_worker.child.timing import ChildTiming, TimingSet
from gpu_worker.child.verify import ChildVerification
from gpu_worker.timing_inputs import pool_cases, set_key


def serve(server: "Server", request: protocol.Request) -> protocol.Result:
    """One request, by the dispatch table: its handler gets the request's fields as arguments."""
    handler = COMMANDS[type(request)]
    return handler(server, **{name: getattr(request, name) for name in type(request).model_fields})


class Server:
    """One child's command handlers, each part an object of its own built with exactly what it uses: the
    shared `core` (child.core.ChildCore: trusted references, pins, context, problem, loaded candidate), its
    `inputs` (child.inputs), `exports` (child.exports: output files, fingerprints), `loading` (child.loading:
    load, compile, the guarded call), `timing` (child.timing: preparation, timing sets, timed blocks),
    `profiling` (child.profile), `verification` (child.verify) and the `reference` role's (child.reference).
    The commands delegate. In a candidate's child every part, and which of them each holds, is pinned by
    identity before the candidate loads (ChildCore.pin_trusted)."""

    def __init__(self, tmp: str, role: str, settings=None):
        """`settings`: the worker's GpuWorkerSettings, as the child's channel carried them (child.process)."""
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

    def describe_failure(self, e: BaseException) -> wire.Failure:
        return self.core.describe_failure(e)

    def cmd_cuda_init(self):
        return self.core.cmd_cuda_init()

    def cmd_warm_triton(self):
        return self.core.cmd_warm_triton()

    def cmd_stage(self, cases: list, pool_cases: list = ()):
        if self.core.role == "candidate":  # a verification's: the memory its downloads land in, written now
            self.exports.reserve(len(cases))
        if pool_cases:  # a candidate's timing pools, read from the bank only: never drawn here for a verification
            self.inputs.cmd_stage_pool(pool_cases, banked_only=True)
        return self.inputs.cmd_stage(cases, uncached=self.reference._stage_cached)

    def cmd_stage_timing(self, dist: str, rotate: int, seed: int = 1000, pool: int = 3):
        have = self.timing.timing_sets.get(dist)  # the set held already: nothing to draw
        held = have is not None and have.key == set_key(rotate, seed, pool)
        return self.inputs.cmd_stage_pool([] if held else pool_cases(dist, seed, pool))

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

    def cmd_time(self, **request):
        return self.timing.cmd_time(**request)

    def cmd_host_latency(self, **request):
        return self.timing.cmd_host_latency(**request)

    def cmd_park(self, pool_cases: list = ()):
        parked = self.timing.cmd_park()
        if pool_cases:
            self.inputs.cmd_stage_pool(pool_cases, banked_only=True)
        return parked

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
    protocol.StageTiming: Server.cmd_stage_timing,
    protocol.Load: Server.cmd_load,
    protocol.Compile: Server.cmd_compile,
    protocol.Prepare: Server.cmd_prepare,
    protocol.Verify: Server.cmd_verify,
    protocol.WriteExports: Server.cmd_write_exports,
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

