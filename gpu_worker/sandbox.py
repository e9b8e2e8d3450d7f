"""Parent side of the sandbox: spawn, talk to, watch and kill `gpu_worker.child` processes.

Each child runs in its own session (process group), its own temp directory (also its TMPDIR and
TRITON_HOME), with a wall-clock limit per command, a host-memory limit (RSS polled from /proc, plus
RLIMIT_AS in interpreter mode where no CUDA mappings need the address space) and no core dumps.
A hang, a crash (segfault, abort), CUDA errors, OOM or a Python exception all come back as a
`SandboxFailure` carrying the kind and the log tail; the caller turns it into a rejection and the
worker keeps serving. Candidate children are single-use; the GPU worker keeps warm spares (torch and
Triton already imported) so the next candidate does not pay the import (scheduling.SandboxPool).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

from gpu_worker import protocol, scratch, wire
from gpu_worker.caches import triton_cache_dir
from gpu_worker.forkserver import start_child
from gpu_worker.settings import CHILD_SETTINGS, GpuWorkerSettings, work_root

REPO = Path(__file__).resolve().parent.parent
#: a child's stdout and stderr together (its log file, on the worker's disk); past it the child is killed
LOG_LIMIT = 64 << 20


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


def candidate_triton_cache(tmp: str) -> str:
    """A candidate process's own Triton cache, in its temp directory (`tmp`)."""
    return os.path.join(tmp, "triton-cache")


def triton_env(role: str, tmp: str, settings: GpuWorkerSettings, cuda: bool) -> dict[str, str]:
    """Where a child's Triton caches its compiled kernels. A candidate compiles into its own directory: the
    OS wall lets it write nowhere else, and a shared cache it could write would let it plant a kernel binary
    under another kernel's key. Trusted children share the host's cache (caches.triton_cache_dir: under the
    cache root, per GPU model), autotuning results included, so a restarted worker finds the baseline's
    (FLA's) choices instead of timing every config again (about a minute per shape on an H200)."""
    if role == "candidate":
        return {"TRITON_CACHE_DIR": candidate_triton_cache(tmp), "TRITON_CACHE_AUTOTUNING": "0"}
    return {"TRITON_CACHE_DIR": str(triton_cache_dir(settings, cuda)), "TRITON_CACHE_AUTOTUNING": "1"}


def input_bank_dir(workdir: Path | None = None) -> Path:
    """Inputs the reference child generated, read by candidate children (see child.inputs)."""
    d = work_root(workdir) / "input-bank"
    d.mkdir(parents=True, exist_ok=True)
    return d


def default_mem_gb() -> float:
    """Half the host's memory, at most 32 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError):
        total = 16.0
    return max(2.0, min(32.0, total / 2))


def tail_bytes(path: str, n: int) -> bytes | None:
    """A file's last `n` bytes, read from its end (a child's log may be large); None where it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - n))
            return f.read(n)
    except OSError:
        return None


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child_pythonpath(environ) -> str:
    """A child process's PYTHONPATH: the repository first, then the worker's own entries, which may hold the
    packages the child imports (a host whose extra packages are on PYTHONPATH, not in site-packages)."""
    return str(REPO) + (os.pathsep + environ["PYTHONPATH"] if environ.get("PYTHONPATH") else "")


class Sandbox:
    def __init__(self, role: str, interpreter: bool, mem_limit_gb: float | None = None, cpus: set | None = None,
                 settings: GpuWorkerSettings | None = None):
        """`cpus`: the cores the child starts on (None: those it inherits); scheduling.pin moves it later.
        `settings`: the worker's (None: the defaults), resolved for this child's device and handed to it."""
        self.role = role
        self.interpreter = interpreter
        self.settings = (settings or GpuWorkerSettings()).for_device(not interpreter)
        workdir = self.settings.gpu_workdir
        self.mem_limit = int((mem_limit_gb or self.settings.sandbox_mem_gb or default_mem_gb()) * (1 << 30))
        self.tmp = scratch.make(role, work_root(workdir))
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        # a candidate child's guard writes each refusal here at once; the reading end stays in this
        # process, so a candidate that empties its own records cannot take one back (see guard.Seal)
        self._guard_r, guard_w = os.pipe() if role == "candidate" else (None, None)
        self.guard_records: list[tuple[str, str]] = []
        env = dict(os.environ)
        env["PYTHONPATH"] = child_pythonpath(env)
        env["TMPDIR"] = self.tmp
        env["TRITON_HOME"] = self.tmp
        env.update(triton_env(role, self.tmp, self.settings, not interpreter))
        # the internal channels to the child (gpu_worker.settings): not user settings
        if guard_w is not None:
            env["MARATHON_GUARD_FD"] = str(guard_w)
        env["MARATHON_INPUT_BANK"] = str(input_bank_dir(workdir))
        env[CHILD_SETTINGS] = self.settings.to_child()
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
        # run hung that way. The cores are `cpus`, where the worker keeps others for timed work (scheduling.pin).
        env["MARATHON_CHILD_LIMITS"] = json.dumps({
            "core": 0, "address_space": self.mem_limit * 2 if interpreter else None,
            "cpus": sorted(cpus) if cpus else None})
        # forked from a process that has imported torch and Triton already (gpu_worker.forkserver)
        self.proc = start_child(["gpu_worker.child", str(r1), str(w2), self.tmp, role], env, self.tmp,
                                (r1, w2) + ((guard_w,) if guard_w is not None else ()))
        os.close(r1)
        os.close(w2)
        if guard_w is not None:
            os.close(guard_w)
            os.set_blocking(self._guard_r, False)
        self._send = Connection(w1, readable=False)
        self._recv = Connection(r2, writable=False)
        self.ready: protocol.Ready | None = None
        self.closed = False
        self.started = time.time()
        self._seq = 0  # each request's number, which its reply carries back (see call)

    # -------------------------------------------------------------------------------------------
    def log_tail(self, n: int = 6000) -> str:
        """The last `n` bytes of the child's stdout and stderr."""
        return (tail_bytes(os.path.join(self.tmp, "log.txt"), n) or b"").decode(errors="replace")

    def _wait(self, timeout: float, heartbeat: Callable[[], None] | None, what: str):
        """The child's next message, unpickled (plain values: gpu_worker.protocol reads them)."""
        deadline = time.monotonic() + timeout
        while True:
            if heartbeat:
                heartbeat()
            try:
                if self._recv.poll(0.25):
                    raw = pickle.loads(self._recv.recv_bytes())
                    self._check_log(what)  # a flood written within one poll's wait is refused with its reply
                    return raw
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
            self._check_log(what)
            if time.monotonic() > deadline:
                self.close()
                raise SandboxFailure("timeout", f"no answer within {timeout:.0f} s during {what} (hang?); process killed",
                                     self.log_tail())

    def _check_log(self, what: str) -> None:
        if file_size(os.path.join(self.tmp, "log.txt")) > LOG_LIMIT:
            self.close()
            raise SandboxFailure("output", f"the process wrote over {LOG_LIMIT >> 20} MiB to its stdout and stderr "
                                 f"during {what}; process killed", self.log_tail())

    def wait_ready(self, timeout: float = 180, heartbeat=None) -> protocol.Ready:
        if self.ready is None:
            raw = self._wait(timeout, heartbeat, "start-up")
            try:
                self.ready = protocol.Ready.model_validate(raw)
            except ValueError as e:
                self.close()
                raise SandboxFailure("crash", f"sandbox start-up message malformed: {e}", self.log_tail()) from None
        return self.ready

    def call(self, request: protocol.Request, timeout: float, heartbeat=None) -> wire.Reply:
        """Send one request and wait for its reply, read as the request's result type (a reply that does
        not fit it is a `protocol` failure)."""
        return self._exchange(wire.to_wire(request, None), type(request), timeout, heartbeat)

    def _exchange(self, message: dict, request_type: type[protocol.Request], timeout: float,
                  heartbeat=None) -> wire.Reply:
        """`message` sent as it is (with this request's number), its reply read as `request_type`'s."""
        what = request_type.cmd
        if self.closed:
            raise SandboxFailure("crash", "sandbox already closed")
        self.wait_ready(heartbeat=heartbeat)
        self._seq += 1
        seq = self._seq
        try:
            self._send.send_bytes(pickle.dumps({**message, "seq": seq}, protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, BrokenPipeError) as e:
            self.close()
            raise SandboxFailure("crash", f"sandbox pipe broken before {what}: {e}", self.log_tail())
        try:
            raw = self._wait(timeout, heartbeat, what)
        except SandboxFailure:
            raise
        except BaseException:
            # Interrupted between request and reply (an activity's cancellation arrives as an exception in
            # this thread, in the heartbeat or the poll): the command may still be running, on the device
            # too, and its reply would be read by the next caller as the answer to another command. The
            # child is killed instead; the harness makes a new one when it next needs one.
            self.close()
            raise
        reply = wire.read_reply(request_type, raw)
        if reply.seq != seq:  # a reply that answers another request is never used
            self.close()
            raise SandboxFailure("crash", f"sandbox reply out of step during {what}: request {seq}, reply "
                                 f"{reply.seq!r}; process killed", self.log_tail())
        records = self.read_guard()
        if records:  # the guard's own reports first: they cannot have been edited by the candidate
            reply = dataclasses.replace(reply, violations=tuple(records) + tuple(
                v for v in reply.violations if tuple(v) not in records))
        if reply.failure is not None and reply.failure.fatal:
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

    def close(self, graceful: bool = False, grace_s: float = 5.0) -> None:
        """Kill the child; `graceful`: first ask it to exit and wait up to `grace_s` (a reference child
        finishes writing the cache entries it queued before it exits)."""
        if self.closed:
            return
        self.closed = True
        try:
            if graceful and self.proc.poll() is None:
                try:
                    self._send.send_bytes(pickle.dumps(wire.to_wire(protocol.Exit(), None)))
                    self.proc.wait(timeout=grace_s)
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
