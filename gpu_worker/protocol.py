"""The messages between the harness (the worker process) and a sandbox child, every one typed.

A request is one `Request` subclass per command; its `cmd` names it on the wire and its `result_type` is
the type of what a successful reply carries. How they travel, validated on arrival: `gpu_worker.wire`.

* Requests are strict (`Message`): an unknown command, a missing or extra field, or a value of the wrong
  type is refused by the child with one `protocol` failure reply, and the child goes on serving.
* Results are checked on arrival in the worker (`Result`: extra fields refused, numbers coerced, since
  device libraries hand back their own number types); a reply that does not fit its request's result
  type becomes a `protocol` failure, which the harness treats as any failed command of that child.

The child's dispatch table (`gpu_worker.child.COMMANDS`) maps each request type to its handler; a test
holds it to the list below, so no command is served that is not declared here.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

#: one verification or reference case: (distribution, seed)
Case = tuple[str, int]


class Message(BaseModel):
    """A request's fields: exact types, nothing extra, immutable."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Result(BaseModel):
    """A reply's fields: nothing extra; numbers of other numeric types coerced."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- shared parts -----------------------------------------------------------------------------------


class OutputHandle(Message):
    """An output a candidate child wrote to a file of its temp dir, for the reference child to read."""

    path: str
    dtype: str
    shape: tuple[int, ...]


class CompareJob(Message):
    """One output compared in the reference child: with the oracle of `case`, or with the output `other`
    (the determinism rerun)."""

    name: str
    out: OutputHandle
    case: Case | None = None
    other: OutputHandle | None = None


class TimedJob(Message):
    """A kept output of a timed call, which ran on pool entry `entry` of its distribution's timing set."""

    entry: int
    name: str
    out: OutputHandle


Timing = dict[str, float]  # seconds (and counts) per step, for the worker's phase log


# --- results ----------------------------------------------------------------------------------------


class Empty(Result):
    pass


class Ready(Result):
    """The child's first message, before any request."""

    ready: bool
    cuda: bool
    pid: int
    import_s: float


class CudaReady(Result):
    cuda: bool




class Staged(Result):
    seconds: float


class Loaded(Result):
    kernels: list[str]
    wall: dict[str, Any]  # the OS wall the child is enclosed in (gpu_worker.wall.enclose)


class CompiledKernel(Result):
    name: str | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    shared: int | None = None
    registers: int | None = None
    spills: int | None = None
    handles_error: str | None = None
    ptx_wgmma: bool | None = None
    ptx_mma: bool | None = None
    ptx_tma: bool | None = None
    cubin_path: str | None = None


class Compiled(Result):
    seconds: float
    kernels: list[CompiledKernel]
    max_shared: int | None
    timing: Timing


class Captured(Result):
    captured: bool
    why: str


class Prepared(Result):
    timing: Timing
    captured: Captured | None = None  # asked with `capture`


class VerifiedCase(Result):
    dist: str
    seed: int
    hash_before: str
    mutated: list[str]
    outputs: dict[str, OutputHandle]
    out_type_ok: bool


class StaleProbe(Result):
    case: int  # the case whose inputs the reused buffers were given
    outputs: dict[str, OutputHandle]


class Verified(Result):
    cases: list[VerifiedCase]
    rerun: dict[str, OutputHandle] | None = None
    stale: StaleProbe | None = None
    changed: list[str] = []  # kept outputs that are no longer the tensors their call wrote
    timing: Timing  # seconds per step


class Exported(Result):
    changed: list[str]  # outputs that changed after their call returned
    timing: Timing


class Timed(Result):
    times: list[float]  # device milliseconds per timed repetition
    mode: str
    # per timed repetition: [entry, [projection per output]] (candidate) or [entry, [projection], [norm]]
    # (reference); their shape is checked by the harness (harness.timed_outputs: _check_entries, check_fingerprints)
    checks: list[list[Any]]
    check_names: list[str]
    keys: list[int] = []  # per timed repetition, the key its values were drawn with (gpu_worker.timing_inputs)


class HostLatency(Result):
    walls: list[float]
    jobs: list[TimedJob] = []  # with `export`: the kept timed outputs downloaded, for `WriteExports`


class Profiled(Result):
    kernels: dict[str, float]  # kernel name -> device ms per call launched by the work
    kernel_ms_per_call: float
    launches_per_call: float


class SetUp(Result):
    baseline: str
    shape: str
    cuda: bool


class ReferenceCase(Result):
    dist: str
    seed: int
    hash: str
    baseline_err: float  # NaN where the baseline was not run
    timing: Timing


class References(Result):
    cases: list[ReferenceCase]


class Comparison(Result):
    rel_err: float
    nonfinite: int
    numel: int
    constant: bool


class Compared(Result):
    results: list[Comparison]
    timing: Timing


class TimedComparison(Result):
    rel_err: float
    nonfinite: int


class TimedCompared(Result):
    results: list[TimedComparison]


class Ceilings(Result):
    bandwidth: float | None  # bytes/s, device-to-device copy (read + write)
    flops: float | None  # bf16 matmul FLOP/s


class ReceiptFacts(Result):
    torch: str
    triton: str
    device: str
    driver: str
    clocks: str
    baseline_env: str = ""  # Problem.baseline_env in the reference child


# --- requests ---------------------------------------------------------------------------------------

class Request(Message):
    """A command to a child; `result_type` is what its successful reply carries."""

    cmd: ClassVar[str]
    result_type: ClassVar[type[Result]] = Empty


class Exit(Request):
    cmd = "exit"


class CudaInit(Request):
    """Make the child's CUDA context (untimed device work)."""

    cmd = "cuda_init"
    result_type = CudaReady


class WarmTriton(Request):
    """Triton's per-process keys (host work)."""

    cmd = "warm_triton"


class Stage(Request):
    """Cases' inputs into host memory (host work); `pool_cases`: a candidate's timing-set pools too, those the
    input bank holds (its benchmark's preparation then reads them mapped already)."""

    cmd = "stage"
    result_type = Staged
    cases: list[Case]
    pool_cases: list[Case] = []


class StageTiming(Request):
    """A distribution's timing-set pool into host memory (host work, before the untimed job that makes the
    set): drawn, or read from the input bank; nothing where the child holds that set already."""

    cmd = "stage_timing"
    result_type = Staged
    dist: str
    rotate: int
    seed: int = 1000
    pool: int = 3


class Load(Request):
    """Enclose the child in its wall and execute the candidate's module (candidate role); then, as `Stage`
    does, the `stage` cases' inputs into host memory (host work both)."""

    cmd = "load"
    result_type = Loaded
    source: str
    problem: str
    shape: str | None
    write_roots: list[str] = []
    trusted_roots: list[str] = []
    stage: list[Case] = []


class Compile(Request):
    cmd = "compile"
    result_type = Compiled
    dist: str


class Prepare(Request):
    """Upload verification cases, and/or make a distribution's timing set (`rotate` static sets); with
    `capture`, then capture the set's CUDA graphs in the same untimed job (never inside a timing window)."""

    cmd = "prepare"
    result_type = Prepared
    cases: list[Case] | None = None
    rotate: int | None = None
    dist: str | None = None
    kernels: bool = True
    seed: int = 1000
    pool: int = 3
    capture: bool = False


class Verify(Request):
    """The verify stage in one command (untimed device work): the cases uploaded and run, the determinism
    rerun, the stale-output probe (with two cases or more), the kept outputs downloaded for
    `WriteExports` (host work)."""

    cmd = "verify"
    result_type = Verified
    cases: list[Case]
    rerun: bool = True
    stale: bool = True


class WriteExports(Request):
    """The late-write check of the outputs `Verify` or `ExportTimed` downloaded, and their files (host work)."""

    cmd = "write_exports"
    result_type = Exported


class Time(Request):
    cmd = "time"
    result_type = Timed
    reps: int
    warmup: int = 3
    mode: str = "back-to-back"
    keep_one: bool = False
    dist: str | None = None
    check_seed: int | None = None
    device_floor_ms: float = 0.0
    entries: list[int] | None = None
    noise_seed: int | None = None
    first: int = 0
    keys: list[int] | None = None  # with `entries` (reference role): the candidate's keys for them


class HostLatencyRequest(Request):
    """A side's last step of a distribution's timing block; with `export` (the candidate's) it also
    downloads the timed calls' kept outputs, for `WriteExports`, with no device job of its own."""

    cmd = "host_latency"
    result_type = HostLatency
    reps: int = 10
    dist: str | None = None
    noise_seed: int | None = None
    first: int = 0
    export: bool = False


class Park(Request):
    """The child waits, kept, for a later benchmark: its timing sets dropped; `pool_cases`, those of the timing
    pools the input bank holds mapped in meanwhile (host work), for that benchmark's preparation."""

    cmd = "park"
    pool_cases: list[Case] = []


class Profile(Request):
    cmd = "profile"
    result_type = Profiled
    reps: int = 10
    dist: str | None = None
    noise_seed: int | None = None
    first: int = 0


class Setup(Request):
    """Set the reference child up for a problem and shape (reference role)."""

    cmd = "setup"
    result_type = SetUp
    problem: str
    shape: str | None


class Reference(Request):
    cmd = "reference"
    result_type = References
    cases: list[Case]
    baseline: bool = True


class Compare(Request):
    cmd = "compare"
    result_type = Compared
    jobs: list[CompareJob]


class CompareTimed(Request):
    cmd = "compare_timed"
    result_type = TimedCompared
    jobs: list[TimedJob]
    noise_seed: int
    dist: str | None = None


class MeasureCeilings(Request):
    cmd = "ceilings"
    result_type = Ceilings


class Receipt(Request):
    cmd = "receipt"
    result_type = ReceiptFacts


REQUESTS: dict[str, type[Request]] = {c.cmd: c for c in (
    Exit, CudaInit, WarmTriton, Stage, StageTiming, Load, Compile, Prepare, Verify, WriteExports, Time,
    HostLatencyRequest, Park, Profile, Setup, Reference, Compare, CompareTimed, MeasureCeilings, Receipt)}
