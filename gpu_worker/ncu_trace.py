"""The Nsight Compute proof's decisions, plain functions: where ncu is, its command, its CSV read as the
process's kernels in launch order, that trace split into the candidate's calls by the trusted marker
kernels, the refusal rules, and which candidates are proven.

The proof process (gpu_worker.ncu_proof_child) launches, in this order: trusted work only (its CUDA
context, the timing set, one rehearsal of a repetition's refill and flush, the call markers once to compile
them), the OPEN marker, then the candidate's import, then per call: the next repetition's values, the L2
flush, BEGIN, the candidate's call, END, a synchronize. ncu serializes every launch, so the CSV's IDs are
launch order. What ran before OPEN is the trusted side's vocabulary: after it, a kernel outside a call must
be one of those, a marker, or torch's fill/copy; a kernel inside a call must be the candidate's own Triton
kernel or torch's fill/copy."""

from __future__ import annotations

import ast
import contextlib
import csv
import glob
import io
import re
import shutil
import threading
import time
from dataclasses import dataclass, field

from baselines.parse import parse as parse_source
from gpu_worker.phases import add_phase
from gpu_worker.timing import crosscheck, is_torch_fill_or_copy, median

#: where an Nsight Compute install keeps its CLI when it is not on PATH
NCU_GLOBS = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu")
METRIC = "gpu__time_duration.sum"
#: the metric's unit (ncu --print-units base gives nanoseconds) -> nanoseconds
UNITS_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
#: a Triton kernel's name is its Python function's: an identifier (library kernels are C++ signatures)
TRITON_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_REFUSALS = 8  # the first few are named; the count says how many more
_NCU_SESSION = threading.Lock()  # this worker's one ncu session (ncu_session)


@contextlib.contextmanager
def ncu_session(hb=None):
    """Held wherever a process under ncu launches kernels (the proof's device job and its timed calls, the
    profile's whole run), heartbeating while another holds it: a process under ncu fails where the GPU's
    profiling resources are taken ("a driver resource was unavailable"), so no two of this worker's contend.
    Entered inside a device turn, and no holder waits for a turn (a proof's keeps it past its turn, until
    its process has ended): turns never wait on each other through it, and it is held for seconds, not
    for a turn's queue."""
    t0 = time.monotonic()
    while not _NCU_SESSION.acquire(timeout=1.0):
        if hb:
            hb()
    t1 = time.monotonic()
    add_phase("ncu-session.wait", t1 - t0)  # the phase log shows how long proofs queue for the session
    try:
        yield
    finally:
        _NCU_SESSION.release()
        add_phase("ncu-session.held", time.monotonic() - t1)


class TraceError(ValueError):
    """ncu's output is not a trace this proof can read."""


@dataclass(frozen=True)
class Kernel:
    id: int
    pid: int
    name: str
    ns: float


@dataclass(frozen=True)
class Markers:
    """The trusted marker kernels' names: fresh per proof, so no candidate source can name them ahead."""

    open: str
    begin: str
    end: str

    @classmethod
    def fresh(cls, token: str) -> "Markers":
        if not re.fullmatch(r"[A-Za-z0-9_]+", token):
            raise ValueError(f"marker token {token!r} is not an identifier's tail")
        return cls(*(f"marathon_proof_{k}_{token}" for k in ("open", "begin", "end")))

    def names(self) -> tuple[str, str, str]:
        return (self.open, self.begin, self.end)


@dataclass
class ProofVerdict:
    """What the proof found; `ok` only with no refusal."""

    judged_ms: float
    kernel_ms: float | None = None
    allowed_ms: float | None = None
    launches: float | None = None
    calls: int = 0
    seen: list[str] = field(default_factory=list)  # the candidate's own kernels in the timed calls
    refusals: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refusals and self.kernel_ms is not None

    @property
    def family(self) -> str | None:
        """What the rejection's reason starts with: `lazy-output` for the candidate's kernel outside its
        calls (work done after a call returned), `library-kernel` for another's inside one (as the CUPTI
        cross-check names it)."""
        if any("launched outside any call" in r for r in self.refusals):
            return "lazy-output"
        return "library-kernel" if any("neither the candidate's Triton kernel" in r for r in self.refusals) else None

    def text(self) -> str:
        head = "proven" if self.ok else "REFUSED"
        figures = (f"ncu kernel time {self.kernel_ms:.4g} ms/call vs judged {self.judged_ms:.4g} ms (allowed gap "
                   f"{self.allowed_ms:.3g} ms, {self.launches:.3g} launches per call, {self.calls} calls)"
                   if self.kernel_ms is not None else f"judged {self.judged_ms:.4g} ms, no per-call figure")
        refused = "" if self.ok else "; refused: " + " | ".join(self.refusals)
        return f"{head}: {figures}; candidate kernels seen: {self.seen or 'NONE'}{refused}"

    def as_dict(self) -> dict:
        return {"ok": self.ok, "kernel_ms": self.kernel_ms, "judged_ms": self.judged_ms,
                "allowed_ms": self.allowed_ms, "launches": self.launches, "calls": self.calls,
                "seen": list(self.seen), "refusals": list(self.refusals)}


def find_ncu(which=shutil.which, pattern_glob=glob.glob) -> str | None:
    """ncu on PATH, else the newest install under the usual places; None when there is none."""
    found = which("ncu")
    if found:
        return found
    for pattern in NCU_GLOBS:
        hits = sorted(pattern_glob(pattern))
        if hits:
            return hits[-1]
    return None


def ncu_command(ncu: str, log_file: str, target: list[str]) -> list[str]:
    """ncu over `target` (a fresh process): kernel durations only, clocks and caches left as they are (the
    proof flushes L2 itself, as the judge does), one CSV written by ncu's front end to `log_file`, a path
    outside the proof process's writable directory. Kernel names demangled, as torch's profiler gives them
    (`timing.is_torch_fill_or_copy` reads them so); only the launched application is traced (it may start
    no process of its own, and Triton's ptxas launches no kernel)."""
    return [ncu, "--clock-control", "none", "--cache-control", "none", "--metrics", METRIC, "--csv",
            "--print-units", "base", "--print-kernel-base", "demangled", "--target-processes", "application-only",
            "--log-file", log_file, *target]


def _number(text: str) -> float:
    return float(text.replace(",", "").strip())


def parse_ncu_csv(text: str) -> list[Kernel]:
    """Every kernel in ncu's CSV (`--csv --metrics gpu__time_duration.sum`), in launch order, with its
    duration in nanoseconds. Lines before the header (ncu's `==PROF==` notes) are skipped. Raises
    TraceError for text with no header, a header without the needed columns, or a row it cannot read."""
    start = next((m.start() for m in re.finditer(r'(?m)^"ID",', text)), None)
    if start is None:
        raise TraceError("no ncu CSV header (a line starting \"ID\",) in ncu's output")
    rows = csv.DictReader(io.StringIO(text[start:]))
    need = {"ID", "Process ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"}
    missing = need - set(rows.fieldnames or ())
    if missing:
        raise TraceError(f"ncu CSV header lacks {sorted(missing)}")
    kernels: dict[int, Kernel] = {}
    for n, row in enumerate(rows, start=2):
        if row.get("ID") is None or str(row["ID"]).startswith("=="):
            continue
        if row.get("Metric Name") != METRIC:
            continue
        try:
            kid, pid = int(_number(row["ID"])), int(_number(row["Process ID"]))
            scale = UNITS_NS[row["Metric Unit"].strip()]
            ns = _number(row["Metric Value"]) * scale
        except (KeyError, ValueError, AttributeError) as e:
            raise TraceError(f"ncu CSV row {n} unreadable ({type(e).__name__}: {e}): {dict(row)}") from None
        if kid in kernels:
            raise TraceError(f"ncu CSV names kernel ID {kid} twice for {METRIC}")
        kernels[kid] = Kernel(kid, pid, row["Kernel Name"], ns)
    return [kernels[k] for k in sorted(kernels)]


def source_kernel_names(source: str) -> list[str]:
    """The functions the candidate's source makes Triton kernels (`@triton.jit`, `@jit`, `@triton.jit(...)`,
    or `triton.jit(f)`): its own kernels' names as the harness reads them from the text it judged, never as
    its process reports them."""
    try:
        tree = parse_source(source)
    except (SyntaxError, ValueError):
        return []

    def is_jit(node: ast.AST) -> bool:
        target = node.func if isinstance(node, ast.Call) else node
        return (target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")) == "jit"

    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(is_jit, node.decorator_list)):
            names.add(node.name)
        elif isinstance(node, ast.Call) and is_jit(node) and node.args and isinstance(node.args[0], ast.Name):
            names.add(node.args[0].id)
    return sorted(names)


def _ncu_says(text: str, words: str) -> bool:
    """Whether one of ncu's own `==` lines says `words`: never a kernel's name in a CSV row, which a candidate
    chooses."""
    return any(line.startswith("==") and words in line for line in text.splitlines())


def counters_refused(text: str) -> bool:
    """Whether ncu itself says it may not read the GPU's counters (a host setting, no verdict on anyone)."""
    return _ncu_says(text, "ERR_NVGPUCTRPERM")


def profiling_taken(text: str) -> bool:
    """Whether ncu itself says another process held the GPU's profiling resources (the host's doing, or at
    most a refused candidate's own: never a way past its proof)."""
    return _ncu_says(text, "driver resource was unavailable")


def proof_due(would_be_best: bool, share: float, draw) -> bool:
    """Whether a passing candidate is proven: a would-be best always; another with probability `share`,
    `draw()` a uniform number in [0, 1) from the worker's secret generator (drawn only for those)."""
    return would_be_best or (share > 0 and draw() < share)


def _where(done: int, total: int) -> str:
    if done == 0:
        return "before the first call"
    return "after the last call returned" if done >= total else f"after call {done} returned"


def judge_trace(kernels: list[Kernel], markers: Markers, own: list[str], warmup: int, reps: int,
                judged_ms: float) -> ProofVerdict:
    """The proof's verdict on a trace (see the module's docstring): the calls found between BEGIN and END
    after OPEN, the first `warmup` of them untimed; each refusal one line naming the kernel and where it ran.
    `own`: the candidate's Triton kernel names (`source_kernel_names`; identifiers only count)."""
    v = ProofVerdict(judged_ms=judged_ms)
    refusals: list[str] = []

    def refuse(line: str):
        refusals.append(line)

    if not kernels:
        v.refusals = ["ncu recorded no kernel at all (the profiler did not reach the proof process)"]
        return v
    pid = kernels[0].pid
    for k in kernels:
        if k.pid != pid:
            refuse(f"kernel {k.name!r} (ID {k.id}) ran in process {k.pid}, not the proof's process {pid}")
    opens = [i for i, k in enumerate(kernels) if k.name == markers.open]
    if len(opens) != 1:
        v.refusals = refusals + [f"the OPEN marker ran {len(opens)} times (once expected): the trace cannot be split"]
        return v
    before, after = kernels[:opens[0]], kernels[opens[0] + 1:]
    trusted = {k.name for k in before} - set(markers.names())
    claimed = set(own)
    for name in sorted(claimed):
        if not TRITON_NAME.match(name):
            refuse(f"the candidate names {name!r} as its kernel: no Triton kernel has that name")
        elif name in trusted or name in markers.names():
            refuse(f"candidate kernel {name!r} has the name of a trusted kernel")
    own_set = {n for n in claimed if TRITON_NAME.match(n) and n not in trusted and n not in markers.names()}
    total = warmup + reps
    n_begin = sum(k.name == markers.begin for k in after)
    n_end = sum(k.name == markers.end for k in after)
    if n_begin + n_end != 2 * total or n_begin != n_end:
        refuse(f"{n_begin + n_end} call markers ({n_begin} BEGIN, {n_end} END) where 2 x {total} calls expected")
    calls: list[list[Kernel]] = []
    inside = False
    for k in after:
        if k.name == markers.begin:
            if inside:
                refuse(f"BEGIN marker (ID {k.id}) inside call {len(calls)}")
            inside = True
            calls.append([])
        elif k.name == markers.end:
            if not inside:
                refuse(f"END marker (ID {k.id}) outside any call ({_where(len(calls), total)})")
            inside = False
        elif k.name == markers.open:
            continue
        elif inside:
            if k.name in own_set or is_torch_fill_or_copy(k.name):
                calls[-1].append(k)
            else:
                refuse(f"kernel {k.name!r} (ID {k.id}) ran inside call {len(calls)}: neither the candidate's "
                       "Triton kernel nor torch's fill/copy")
        elif k.name in claimed:
            refuse(f"candidate kernel {k.name!r} (ID {k.id}) launched outside any call ({_where(len(calls), total)})")
        elif k.name not in trusted and not is_torch_fill_or_copy(k.name):
            refuse(f"kernel {k.name!r} (ID {k.id}) ran outside any call ({_where(len(calls), total)}) and is no "
                   "trusted step's")
    if inside:
        refuse(f"call {len(calls)} never ended (no END marker after it)")
    timed = calls[warmup:] if len(calls) == total else []
    v.calls = len(calls)
    v.seen = sorted({k.name for c in timed for k in c if k.name in own_set})
    if timed:
        v.kernel_ms = median([sum(k.ns for k in c) / 1e6 for c in timed])
        v.launches = median([float(len(c)) for c in timed])
        ok, v.allowed_ms = crosscheck(judged_ms, v.kernel_ms, v.launches)
        if not v.seen:
            refuse("no kernel of the candidate's own ran in any timed call")
        if not ok:
            refuse(f"ncu kernel time {v.kernel_ms:.4g} ms/call differs from the judged {judged_ms:.4g} ms by more "
                   f"than {v.allowed_ms:.3g} ms")
    extra = len(refusals) - MAX_REFUSALS
    v.refusals = refusals[:MAX_REFUSALS] + ([f"... and {extra} more"] if extra > 0 else [])
    return v
