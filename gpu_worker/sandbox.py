"""Parent side of the sandbox: spawn, talk to, watch and kill `gpu_worker.child` processes.

Each child runs in its own session (process group), its own temp directory (also its TMPDIR and
TRITON_HOME), with a wall-clock limit per command, a host-memory limit (RSS polled from /proc, plus
RLIMIT_AS in interpreter mode where no CUDA mappings need the address space) and no core dumps.
A hang, a crash (segfault, abort), CUDA errors, OOM or a Python exception all come back as a
`SandboxFailure` carrying the kind and the log tail; the caller turns it into a rejection and the
worker keeps serving. Candidate children are single-use; `SandboxPool` keeps warm spares (torch and
Triton already imported) so the next candidate does not pay the import.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent


class SandboxFailure(Exception):
    """The child failed (hang, crash, CUDA error, OOM): `kind` says how; the caller turns it into a rejection."""

    def __init__(self, kind: str, reason: str, log: str = ""):
        super().__init__(f"{kind}: {reason}")
        self.kind, self.reason, self.log = kind, reason, log


class Rejection(Exception):
    """The candidate is refused at `stage`: a verdict, returned as a report, never an infrastructure error."""

    def __init__(self, stage: str, reason: str, log: str = ""):
        super().__init__(reason)
        self.stage, self.reason, self.log = stage, reason, log


def work_root() -> Path:
    root = Path(os.environ.get("MARATHON_GPU_WORKDIR") or Path(tempfile.gettempdir()) / f"marathon-gpu-{os.getuid()}")
    root.mkdir(parents=True, exist_ok=True)
    return root


def triton_cache_dir() -> Path:
    d = work_root() / "triton-cache"
    d.mkdir(parents=True, exist_ok=True)
    return d


def input_bank_dir() -> Path:
    """Inputs the reference child generated, read by candidate children (see child._host_inputs)."""
    d = work_root() / "input-bank"
    d.mkdir(parents=True, exist_ok=True)
    return d


def default_mem_gb() -> float:
    """Half the host's memory, at most 32 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError):
        total = 16.0
    return max(2.0, min(32.0, total / 2))


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Sandbox:
    live = 0  # children started and not yet closed, in this process: each holds a CUDA context
    # (when, bytes): the device's free memory as a reference child last read it (harness.DeviceMemory);
    # only trusted children report it, a candidate could lie to make its neighbours run out of memory
    device_free: tuple[float, int] | None = None
    _live_lock = threading.Lock()

    def __init__(self, role: str, interpreter: bool, mem_limit_gb: float | None = None):
        self.role = role
        self.interpreter = interpreter
        self.mem_limit = int((mem_limit_gb or float(os.environ.get("MARATHON_SANDBOX_MEM_GB", "0")) or default_mem_gb())
                             * (1 << 30))
        self.tmp = tempfile.mkdtemp(prefix=f"{role}-", dir=work_root())
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        # a candidate child's guard writes each refusal here at once; the reading end stays in this
        # process, so a candidate that empties its own records cannot take one back (see guard.Seal)
        self._guard_r, guard_w = os.pipe() if role == "candidate" else (None, None)
        self.guard_records: list[tuple[str, str]] = []
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["TMPDIR"] = self.tmp
        env["TRITON_HOME"] = self.tmp
        # a candidate compiles into its own directory: the OS wall lets it write nowhere else, and a shared
        # cache it could write would let it plant a kernel binary under another kernel's key
        env["TRITON_CACHE_DIR"] = os.path.join(self.tmp, "triton-cache") if role == "candidate" else str(triton_cache_dir())
        if guard_w is not None:
            env["MARATHON_GUARD_FD"] = str(guard_w)
        env["MARATHON_INPUT_BANK"] = str(input_bank_dir())
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        if interpreter:
            env["TRITON_INTERPRET"] = "1"
        else:
            env.pop("TRITON_INTERPRET", None)
        # The child sets its own limits first thing (child.apply_limits), before it imports anything or
        # loads a candidate. Not a preexec_fn: Python code between fork and exec in this multi-threaded
        # worker can deadlock in the forked child (CPython resets its thread states there under a lock
        # another thread may have held at the fork), and the Popen then waits for the exec forever; a CI
        # run hung that way. The cores are those outside the ones kept for timed work until the worker
        # moves the child there (see pin).
        env["MARATHON_CHILD_LIMITS"] = json.dumps({
            "core": 0, "address_space": self.mem_limit * 2 if interpreter else None,
            "cpus": sorted(TIMING_CPUS[1]) if TIMING_CPUS else None})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_worker.child", str(r1), str(w2), self.tmp, role],
            pass_fds=(r1, w2) + ((guard_w,) if guard_w is not None else ()), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd=self.tmp, env=env, start_new_session=True,
        )
        os.close(r1)
        os.close(w2)
        if guard_w is not None:
            os.close(guard_w)
            os.set_blocking(self._guard_r, False)
        self._send = Connection(w1, readable=False)
        self._recv = Connection(r2, writable=False)
        self.ready: dict | None = None
        self.closed = False
        self.started = time.time()
        self.reserved = 0  # device bytes its allocator holds, as of its last reply (harness.DeviceMemory)
        self._seq = 0  # each request's number, which its reply carries back (see call)
        with Sandbox._live_lock:
            Sandbox.live += 1

    # -------------------------------------------------------------------------------------------
    def log_tail(self, n: int = 6000) -> str:
        try:
            data = Path(self.tmp, "log.txt").read_bytes()
        except OSError:
            return ""
        return data[-n:].decode(errors="replace")

    def _wait(self, timeout: float, heartbeat: Callable[[], None] | None, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            if heartbeat:
                heartbeat()
            try:
                if self._recv.poll(0.25):
                    return pickle.loads(self._recv.recv_bytes())
            except (EOFError, OSError):
                pass
            rc = self.proc.poll()
            if rc is not None:
                # drain a reply that raced the exit
                try:
                    if self._recv.poll(0):
                        return pickle.loads(self._recv.recv_bytes())
                except (EOFError, OSError):
                    pass
                self.close()
                if rc < 0:
                    try:
                        name = signal.Signals(-rc).name
                    except ValueError:
                        name = str(-rc)
                    raise SandboxFailure("crash", f"sandbox process died with {name} during {what}", self.log_tail())
                raise SandboxFailure("crash", f"sandbox process exited with status {rc} during {what}", self.log_tail())
            if _rss_bytes(self.proc.pid) > self.mem_limit:
                self.close()
                raise SandboxFailure("memory", f"host memory limit {self.mem_limit >> 30} GiB exceeded during {what}",
                                     self.log_tail())
            if time.monotonic() > deadline:
                self.close()
                raise SandboxFailure("timeout", f"no answer within {timeout:.0f} s during {what} (hang?); process killed",
                                     self.log_tail())

    def wait_ready(self, timeout: float = 180, heartbeat=None) -> dict:
        if self.ready is None:
            self.ready = self._wait(timeout, heartbeat, "start-up")
        return self.ready

    def call(self, cmd: str, timeout: float, heartbeat=None, **kw) -> dict:
        if self.closed:
            raise SandboxFailure("crash", "sandbox already closed")
        self.wait_ready(heartbeat=heartbeat)
        self._seq += 1
        seq = self._seq
        try:
            self._send.send_bytes(pickle.dumps({"cmd": cmd, "seq": seq, **kw}, protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, BrokenPipeError) as e:
            self.close()
            raise SandboxFailure("crash", f"sandbox pipe broken before {cmd}: {e}", self.log_tail())
        try:
            reply = self._wait(timeout, heartbeat, cmd)
        except SandboxFailure:
            raise
        except BaseException:
            # Interrupted between request and reply (an activity's cancellation arrives as an exception in
            # this thread, in the heartbeat or the poll): the command may still be running, on the device
            # too, and its reply would be read by the next caller as the answer to another command. In
            # session i4 a verification cancelled while the reference child computed oracles left that reply
            # in the pipe; every later call to that child read its predecessor's reply (90 harness errors, and
            # a compare's results could have gone to the wrong candidate). The child is killed instead; the
            # harness makes a new one when it next needs one.
            self.close()
            raise
        if reply.get("seq") != seq:  # defence in depth: a reply that answers another request is never used
            self.close()
            raise SandboxFailure("crash", f"sandbox reply out of step during {cmd}: request {seq}, reply "
                                 f"{reply.get('seq')!r}; process killed", self.log_tail())
        self.reserved = reply.get("reserved", self.reserved)
        records = self.read_guard()
        if records:  # the guard's own reports first: they cannot have been edited by the candidate
            reply["violations"] = records + [v for v in reply.get("violations") or [] if tuple(v) not in records]
        if self.role == "reference" and reply.get("device_free") is not None:
            Sandbox.device_free = (time.monotonic(), int(reply["device_free"]))
        if reply.get("fatal"):
            # CUDA context is unusable after an illegal access or OOM: this process is done
            self.close(graceful=False)
        return reply

    def read_guard(self) -> list[tuple[str, str]]:
        """Every refusal the child's guard reported so far (a candidate child only)."""
        while self._guard_r is not None:
            try:
                data = os.read(self._guard_r, 1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not data:  # every writing end is closed: by the candidate, while its process lives on
                if self.proc.poll() is None and not getattr(self, "_guard_eof", False):
                    self._guard_eof = True
                    self.guard_records.append(("escape", "the guard's report channel was closed in the child"))
                break
            self._guard_buf = getattr(self, "_guard_buf", b"") + data
            *lines, self._guard_buf = self._guard_buf.split(b"\n")
            for line in lines:
                try:
                    rule, detail = json.loads(line)
                    self.guard_records.append((str(rule), str(detail)))
                except (ValueError, TypeError):
                    self.guard_records.append(("escape", "unreadable guard report (the channel was written by the candidate)"))
        return list(self.guard_records)

    def alive(self) -> bool:
        return not self.closed and self.proc.poll() is None

    def close(self, graceful: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        with Sandbox._live_lock:
            Sandbox.live -= 1
        try:
            if graceful and self.proc.poll() is None:
                try:
                    self._send.send_bytes(pickle.dumps({"cmd": "exit"}))
                    self.proc.wait(timeout=5)
                except Exception:  # noqa: BLE001
                    pass
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            pass
        finally:
            for c in (self._send, self._recv):
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass
            if self._guard_r is not None:
                try:
                    os.close(self._guard_r)
                except OSError:
                    pass
                self._guard_r = None
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SandboxPool:
    """Warm spare candidate processes. `acquire()` hands out one (single use) and starts a replacement."""

    def __init__(self, interpreter: bool, spares: int = 1, ready: Callable[[Sandbox], None] | None = None):
        """`ready(sb)`, if given, finishes a new spare before it is handed out (the harness creates its
        CUDA context under the GPU gate); then spares are made in the background."""
        self.interpreter = interpreter
        self.spares = spares
        self.ready = ready
        self._lock = threading.Lock()
        self._idle: list[Sandbox] = []
        self._starting = 0
        self._closed = False
        if ready is None:
            self.fill()
        else:
            threading.Thread(target=self.fill, daemon=True).start()

    def fill(self) -> None:
        with self._lock:
            self._idle = [s for s in self._idle if s.alive()]
            n = max(0, self.spares - len(self._idle) - self._starting) if not self._closed else 0
            if self.ready is None:
                self._idle += [Sandbox("candidate", self.interpreter) for _ in range(n)]
                return
            self._starting += n
        new = [Sandbox("candidate", self.interpreter) for _ in range(n)]  # they start side by side
        # and are readied side by side, each handed out as soon as it is ready: readied one after another,
        # a burst of compiles (a population's proposals arrive together) found the pool dry while the last
        # spares waited for the first ones' contexts, and made their own (docs/throughput.md, session i)
        threads = [threading.Thread(target=self._ready_one, args=(sb,), daemon=True) for sb in new]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _ready_one(self, sb: Sandbox) -> None:
        try:
            self.ready(sb)
        except Exception:  # noqa: BLE001 - a spare that failed to start is dropped, not handed out
            sb.close()
        with self._lock:
            self._starting -= 1
            if self._closed or not sb.alive():
                sb.close()
            else:
                self._idle.append(sb)

    def acquire(self) -> Sandbox:
        with self._lock:
            sb = None
            while self._idle:
                cand = self._idle.pop(0)
                if cand.alive():
                    sb = cand
                    break
                cand.close()
        if sb is None:
            sb = Sandbox("candidate", self.interpreter)
        threading.Thread(target=self.fill, daemon=True).start()
        return sb

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()


class LoadedChildren:
    """Candidate children that already hold one candidate's module and compiled kernels, handed on from
    compile to verify to benchmark of the same candidate on this worker. Each new child paid for its
    start-up and for loading the candidate's kernels (seconds each for KDA on the H200: the phase log's
    prepare.kernels); a hand-off pays once. Isolation between candidates is unchanged: a child only ever
    holds one candidate. A stage that finds none (another worker compiled it, a retry, an eviction) loads
    a fresh child as before; children older than `ttl` seconds or beyond `limit` are closed, oldest first.

    Several children may hold the same candidate (up to `per_key`): the current best takes part in every
    benchmark, and benchmarks overlap, so each one that found the best's child taken used to load another
    and then close it (session d's phase log: 1.2 of 2 children handed on per benchmark)."""

    def __init__(self, limit: int = 16, ttl: float = 900.0, per_key: int = 4):
        self.limit, self.ttl, self.per_key = limit, ttl, per_key
        self._lock = threading.Lock()
        self._kept: list = []  # [key, Sandbox, kept at], oldest first

    def put(self, key, sb: Sandbox) -> None:
        drop = []
        with self._lock:
            if self.limit > 0 and sb.alive():
                self._kept.append((key, sb, time.monotonic()))
            else:
                drop.append(sb)
            now = time.monotonic()
            keep = []
            for entry in self._kept:
                if now - entry[2] > self.ttl:
                    drop.append(entry[1])
                else:
                    keep.append(entry)
            same = [e for e in keep if e[0] == key]
            for e in same[:max(0, len(same) - self.per_key)]:  # the oldest copies of this candidate go
                keep.remove(e)
                drop.append(e[1])
            while len(keep) > self.limit:
                drop.append(keep.pop(0)[1])
            self._kept = keep
        for d in drop:
            d.close()

    def take(self, key) -> Sandbox | None:
        with self._lock:
            i = next((i for i in range(len(self._kept) - 1, -1, -1) if self._kept[i][0] == key), None)
            item = self._kept.pop(i) if i is not None else None
        if item is None:
            return None
        _, sb, t = item
        if not sb.alive() or time.monotonic() - t > self.ttl:
            sb.close()
            return None
        return sb

    def __len__(self) -> int:
        return len(self._kept)

    def reserved(self) -> int:
        """Device bytes the waiting children hold (a kept best keeps its timing sets)."""
        with self._lock:
            return sum(sb.reserved for _, sb, _ in self._kept)

    def close(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, []
        for _, sb, _ in kept:
            sb.close()


def timing_cpus() -> tuple[set, set] | None:
    """(cores kept for timed work, cores for everything else), or None when the host is too small to
    spare any. Why: a many-launch baseline (FLA's chunk_kda) may be host-bound between its launches, and
    with every core compiling candidates it timed 1.17-1.73 ms in-run against 1.2 ms on a quiet host. Own
    cores alone did not remove that spread on the H200 (docs/throughput.md, session d); cache and memory
    traffic of the busy cores remain shared. MARATHON_TIMING_CPUS: how many (default 2 from 8 up), or
    which ("30,31", "28-29": GPU workers sharing a host each keep their own)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    spec = os.environ.get("MARATHON_TIMING_CPUS", "2" if len(cpus) >= 8 else "0").strip()
    if "," in spec or "-" in spec:  # explicit cores, e.g. "30,31" or "28-29": one set per worker on a shared host
        timed = set()
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            timed |= set(range(int(lo), int(hi or lo) + 1))
        timed &= set(cpus)
        rest = set(cpus) - timed
        return (timed, rest) if timed and rest else None
    want = int(spec)
    if want <= 0 or want >= len(cpus):
        return None
    return set(cpus[-want:]), set(cpus[:-want])


def pin(sandboxes, cpus: set | None) -> None:
    """Move the children's main threads (where launches happen) onto `cpus`; a child gone meanwhile is
    skipped (its failure is reported by its own call)."""
    if not cpus:
        return
    for sb in sandboxes:
        if sb is not None and sb.alive():
            try:
                os.sched_setaffinity(sb.proc.pid, cpus)
            except OSError:
                pass


TIMING_CPUS = timing_cpus()
