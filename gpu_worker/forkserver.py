"""Sandbox children forked from a process that has already imported torch and Triton.

A child started with `python -m` spends about two seconds of a core importing torch and Triton before it
can answer; a worker starts one per candidate. The fork server imports them once (and nothing of this
project, so a child always runs the code on disk) and forks a child per request. A forked child is what
`subprocess.Popen` would have made: the asked argv, environment, working directory and file descriptors
(at the same numbers), its own session, standard streams on /dev/null, no other descriptor of the server
or of other children; then it runs `gpu_worker.child`'s main. CUDA is never initialised in the server,
so each child makes its own context as before. What a child inherits from the server is imported code
only: the judge's secrets are drawn from the OS (os.urandom, secrets) after the fork, never from state
the children share, and the wall keeps a candidate from signalling or tracing the server.

Parent side: `start_child(...)` asks the fork server for the child's import environment (one server per
such environment, started on first use) and returns a `ForkedProcess` (the slice of Popen the sandbox
uses: pid, poll, wait, returncode); where no server can be had it falls back to `subprocess.Popen`. The
server is the child's parent: it reaps each child and writes its wait status into a pipe that the
`ForkedProcess` reads. The server exits when its socket to the worker closes, and its children with it:
a worker that ended without closing them (killed, or an interrupted `marathon verify`) leaves no child
spinning in a candidate's loop or holding device memory.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

# environment read while torch and Triton are imported: a child whose values differ needs another server.
# The per-child Triton directories are read when used, not at import, so they are left out.
_IMPORT_PREFIXES = ("TRITON_", "TORCH", "PYTORCH_", "CUDA_", "OMP_", "MKL_", "OPENBLAS_", "LD_", "PYTHON")
_PER_CHILD = ("TRITON_HOME", "TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING")
_STATUS = struct.Struct("i")
GRACE_S = 3.0  # a child's time to end on SIGTERM once its worker is gone
_MAX_FDS = 8


def import_key(env: dict[str, str]) -> tuple:
    return (sys.executable,) + tuple(sorted((k, v) for k, v in env.items()
                                            if k.startswith(_IMPORT_PREFIXES) and k not in _PER_CHILD))


class ForkedProcess:
    """A child the fork server made: Popen's pid, poll, wait and returncode, the status read from its pipe."""

    def __init__(self, pid: int, status_fd: int):
        self.pid, self._status_fd, self.returncode = pid, status_fd, None

    def _read_status(self, timeout: float | None) -> bool:
        if self._status_fd is None:
            return True
        ready, _, _ = select.select([self._status_fd], [], [], timeout)
        if not ready:
            return False
        data = os.read(self._status_fd, _STATUS.size)
        os.close(self._status_fd)
        self._status_fd = None
        if len(data) == _STATUS.size:
            self.returncode = os.waitstatus_to_exitcode(_STATUS.unpack(data)[0])
        return True  # with no status the server died first: poll looks for the pid itself

    def poll(self) -> int | None:
        if self.returncode is None and self._read_status(0) and self.returncode is None:
            if not _pid_alive(self.pid):
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("forked child", timeout)
            if self._status_fd is not None:
                self._read_status(left)
            else:
                time.sleep(0.05)
        return self.returncode

    def __del__(self):
        if getattr(self, "_status_fd", None) is not None:
            try:
                os.close(self._status_fd)
            except OSError:
                pass


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class ForkServer:
    """The worker's end of one fork server (one per import environment, shared by the worker's threads)."""

    def __init__(self, env: dict[str, str], cwd: str):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-m", "gpu_worker.forkserver", str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.sock = mine
        self.lock = threading.Lock()

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, pass_fds: tuple[int, ...],
              timeout: float = 120.0) -> ForkedProcess:
        """`argv` after `python -m`; the fds keep their numbers in the child. Raises OSError where the
        server cannot make the child (gone, or no answer within `timeout`: its imports included)."""
        status_r, status_w = os.pipe()
        try:
            request = json.dumps({"argv": argv, "env": env, "cwd": cwd, "fds": list(pass_fds)}).encode()
            with self.lock:
                socket.send_fds(self.sock, [request], list(pass_fds) + [status_w])
                os.close(status_w)
                status_w = None
                self.sock.settimeout(timeout)
                try:
                    reply = self.sock.recv(4096)
                finally:
                    self.sock.settimeout(None)
            if not reply:
                raise OSError("the fork server is gone")
            answer = json.loads(reply)
            if "pid" not in answer:
                raise OSError(f"the fork server could not fork: {answer.get('error')}")
            return ForkedProcess(int(answer["pid"]), status_r)
        except BaseException:
            os.close(status_r)
            if status_w is not None:
                os.close(status_w)
            raise

    def close(self) -> None:
        self.sock.close()


_servers: dict[tuple, ForkServer] = {}
_servers_lock = threading.Lock()


def start_child(argv: list[str], env: dict[str, str], cwd: str, pass_fds: tuple[int, ...], forked: bool = True):
    """`python -m argv...` as a child in its own session, forked from the fork server for `env`'s import
    environment; started afresh by Popen where not `forked` or where the server cannot be had (a new
    server is then started next time)."""
    if forked:
        key = import_key(env)
        with _servers_lock:
            server = _servers.get(key)
            if server is None or server.proc.poll() is not None:
                own = {k: v for k, v in env.items()
                       if k not in _PER_CHILD and k != "TMPDIR" and not k.startswith("MARATHON_")}
                server = _servers[key] = ForkServer(own, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        try:
            return server.spawn(argv, env, cwd, pass_fds)
        except OSError:
            with _servers_lock:
                if _servers.get(key) is server:
                    del _servers[key]
            server.close()
    return subprocess.Popen([sys.executable, "-m", *argv], pass_fds=pass_fds, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=env,
                            start_new_session=True)


# ------------------------------------------------------------------------------------------ the server
def _become_child(request: dict, received: list[int], started: int) -> None:
    """In the forked process: become `python -m argv` as Popen would have started it; never returns.
    `started` is closed once the child leads its own session and process group."""
    import fcntl

    code = 1
    try:
        os.setsid()
        os.close(started)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        wanted = [int(fd) for fd in request["fds"]]
        high = max(wanted + received + [2]) + 1
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, high) for fd in received]
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        for want, fd in zip(wanted, moved):
            os.dup2(fd, want)
        keep = {0, 1, 2, *wanted}
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # as `python -m` run there would have it
        sys.dont_write_bytecode = os.environ.get("PYTHONDONTWRITEBYTECODE", "") != ""
        import tempfile

        tempfile.tempdir = None  # computed again from this child's TMPDIR
        import runpy

        module, *args = request["argv"]
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the child's stderr, as an uncaught exception would be
        import traceback

        traceback.print_exc()
        code = 1
    try:  # what interpreter shutdown would do: wait for the non-daemon threads, run the exit handlers
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def end_children(children: dict, reap, grace_s: float = GRACE_S) -> None:
    """SIGTERM to each child's process group (it exits as a killed process would, its exit handlers
    unrun), SIGKILL to those still there after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(children):
            try:
                os.killpg(pid, sig)
            except OSError:  # gone already (reaped next), or its group left behind
                pass
        deadline = time.monotonic() + grace_s
        while children and time.monotonic() < deadline:
            reap()
            time.sleep(0.05)
        if not children:
            return


def serve(sock: socket.socket) -> None:
    import torch  # noqa: F401 - imported once here, inherited by every child
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    if torch.cuda.is_initialized():  # a CUDA context does not survive a fork: children start afresh instead
        raise SystemExit("the fork server initialised CUDA")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: dict[int, int] = {}  # pid -> the write end of its status pipe

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = children.pop(pid, None)
            if fd is not None:
                try:
                    os.write(fd, _STATUS.pack(status))
                except OSError:
                    pass
                os.close(fd)

    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        reap()
        if sock not in ready:
            continue
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, _MAX_FDS + 1)
        if not msg:  # the worker is gone: a child in a candidate's loop would never read its closed pipe
            end_children(children, reap)
            return
        *received, status_w = fds
        started_r, started_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as e:
            for fd in fds + [started_r, started_w]:
                os.close(fd)
            sock.send(json.dumps({"error": str(e)}).encode())
            continue
        if pid == 0:
            _become_child(json.loads(msg), received, started_w)
        for fd in received + [started_w]:
            os.close(fd)
        os.read(started_r, 1)  # until the child has its session: a killpg right after the reply must reach it
        os.close(started_r)
        children[pid] = status_w
        sock.send(json.dumps({"pid": pid}).encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
