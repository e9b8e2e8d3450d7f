"""The operating-system wall around a candidate child: what the process may do, enforced by the kernel.

Installed in the child after CUDA and Triton are initialised (their own subprocesses, `ldconfig`, the C
compiler for Triton's driver module and `ptxas --version`, have run by then) and before the candidate's
module executes. Once installed it cannot be removed, and every thread and process the child makes
inherits it:

* network: no sockets of any family (seccomp on socket(); socketpair's connected pair still works, and
  a unix socket could reach a daemon's socket file; `unix_sockets` lets the ncu proof's process make
  AF_UNIX ones); where Landlock has network rules, TCP bind and connect are refused as well;
* process: no fork, no execve (seccomp); threads (clone with CLONE_THREAD) still work. Where the caller
  names binaries that must still run (Triton's `ptxas`, which compiles each kernel lazily at its first
  launch, and the C compiler of the launcher Triton builds for each new kernel signature), Landlock allows executing exactly those files (and the ELF loader they need), and seccomp
  allows the vfork-style clone that `posix_spawn` makes for them; anything else fails to execute;
* filesystem: writes only beneath the given directories (Landlock). Without Landlock, seccomp refuses
  every open for writing and every namespace change (unlink, rename, mkdir, ...): stricter, since the
  harness's own files written after the load fail too;
* also refused: ptrace and cross-process memory access, io_uring (its operations bypass seccomp),
  namespaces, mounts, BPF, kernel modules and keyrings; with Landlock's scopes, signals to processes
  outside the wall (the worker) and abstract unix sockets.

On a GPU host the child passes Triton's ptxas and the launcher's C compiler (with the programs it runs)
as the binaries left to execute (`enclose`), since Triton compiles each kernel and its launcher at its
first launch, which comes after the candidate has loaded. Landlock then also lets the ELF loader execute
(the kernel runs it for them), and the loader can run other
binaries by name: those still run behind the same seccomp filter and Landlock domain (no network, no
fork, no writes outside). Landlock holds for the installing thread and every thread and process started
after it; threads CUDA started earlier are held by seccomp (installed on all threads) but not by Landlock
(`threads_at_install` in the description says how many there were).

`install(...)` returns a description of the wall that is active ({"network": "seccomp+landlock", ...}),
which the child reports in its load reply. A refusal is an errno (EACCES/EPERM), so Python raises
PermissionError at the call site; the guard then names the family.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import platform
import struct

from gpu_worker.wall_exec import (c_compiler_programs, candidate_exec_files, compiler_binaries,  # noqa: F401
                                  exec_closure)

# --- Linux constants ------------------------------------------------------------------------------
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1  # every thread of the process, not only the caller
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
CLONE_VM = 0x00000100
CLONE_VFORK = 0x00004000
CLONE_THREAD = 0x00010000
O_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

# seccomp_data: nr (u32), arch (u32), ip (u64), args[6] (u64 each, little-endian: low word first)
_OFF_NR, _OFF_ARCH = 0, 4


def _arg(i: int) -> int:
    return 16 + 8 * i


#: per architecture: the audit arch, the seccomp syscall number, Landlock's, and the syscalls named below
_ARCH = {
    "x86_64": {
        "audit": 0xC000003E, "seccomp": 317, "landlock": (444, 445, 446), "x32": 0x40000000,
        "nr": {"socket": 41, "execve": 59, "execveat": 322, "fork": 57, "vfork": 58, "clone": 56,
               "clone3": 435, "open": 2, "openat": 257, "openat2": 437, "creat": 85,
               "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
               "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
               "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
               "bpf": 321, "init_module": 175, "finit_module": 313, "delete_module": 176,
               "kexec_load": 246, "kexec_file_load": 320, "keyctl": 250, "add_key": 248, "request_key": 249,
               "userfaultfd": 323, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsmount": 432,
               "mount_setattr": 442,
               "rename": 82, "renameat": 264, "renameat2": 316, "unlink": 87, "unlinkat": 263,
               "mkdir": 83, "mkdirat": 258, "rmdir": 84, "symlink": 88, "symlinkat": 266, "link": 86,
               "linkat": 265, "truncate": 76, "mknod": 133, "mknodat": 259, "chmod": 90, "fchmodat": 268,
               "chown": 92, "lchown": 94, "fchownat": 260}},
    "aarch64": {
        "audit": 0xC00000B7, "seccomp": 277, "landlock": (444, 445, 446), "x32": None,
        "nr": {"socket": 198, "execve": 221, "execveat": 281, "clone": 220, "clone3": 435,
               "openat": 56, "openat2": 437,
               "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
               "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
               "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
               "bpf": 280, "init_module": 105, "finit_module": 273, "delete_module": 106,
               "kexec_load": 104, "kexec_file_load": 294, "keyctl": 219, "add_key": 217, "request_key": 218,
               "userfaultfd": 282, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsmount": 432,
               "mount_setattr": 442,
               "renameat": 38, "renameat2": 276, "unlinkat": 35, "mkdirat": 34, "symlinkat": 36,
               "linkat": 37, "truncate": 45, "mknodat": 33, "fchmodat": 53, "fchownat": 54}},
}
#: refused whatever the filesystem wall
ALWAYS_REFUSED = ("ptrace", "process_vm_readv", "process_vm_writev", "io_uring_setup", "io_uring_enter",
                  "io_uring_register", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "bpf",
                  "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "keyctl",
                  "add_key", "request_key", "userfaultfd", "open_tree", "move_mount", "fsopen", "fsmount",
                  "mount_setattr")
#: refused when Landlock is absent (seccomp cannot read paths, so no namespace change is allowed)
NAMESPACE_CHANGES = ("rename", "renameat", "renameat2", "unlink", "unlinkat", "mkdir", "mkdirat", "rmdir",
                     "symlink", "symlinkat", "link", "linkat", "truncate", "mknod", "mknodat", "chmod",
                     "fchmodat", "chown", "lchown", "fchownat")

# Landlock access rights (uapi/linux/landlock.h)
LL_EXECUTE = 1 << 0
LL_WRITE_FILE = 1 << 1
LL_REMOVE_DIR = 1 << 4
LL_REMOVE_FILE = 1 << 5
LL_MAKE_CHAR = 1 << 6
LL_MAKE_DIR = 1 << 7
LL_MAKE_REG = 1 << 8
LL_MAKE_SOCK = 1 << 9
LL_MAKE_FIFO = 1 << 10
LL_MAKE_BLOCK = 1 << 11
LL_MAKE_SYM = 1 << 12
LL_REFER = 1 << 13  # ABI 2
LL_TRUNCATE = 1 << 14  # ABI 3
LL_NET_BIND_TCP = 1 << 0  # ABI 4
LL_NET_CONNECT_TCP = 1 << 1
LL_SCOPE_ABSTRACT_UNIX = 1 << 0  # ABI 6
LL_SCOPE_SIGNAL = 1 << 1
LL_CREATE_RULESET_VERSION = 1
LL_RULE_PATH_BENEATH = 1


class WallError(RuntimeError):
    """The wall could not be installed as asked."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int


def _arch() -> dict | None:
    return _ARCH.get(platform.machine())


def landlock_abi() -> int:
    """Landlock's ABI version in this kernel, 0 when it is absent or disabled (or refused by a container's
    own seccomp profile)."""
    a = _arch()
    if a is None:
        return 0
    r = _libc.syscall(a["landlock"][0], None, ctypes.c_size_t(0), ctypes.c_uint32(LL_CREATE_RULESET_VERSION))
    return int(r) if r > 0 else 0


# --- seccomp ---------------------------------------------------------------------------------------
class _Program:
    """A tiny classic-BPF assembler: jumps name labels, resolved at the end."""

    def __init__(self):
        self.ins: list = []  # (code, jt, jf, k), jt/jf as labels or ints
        self.labels: dict[str, int] = {}

    def label(self, name: str):
        self.labels[name] = len(self.ins)

    def ld(self, off: int):
        self.ins.append((_LD_W_ABS, 0, 0, off))

    def jump(self, code: int, k: int, jt, jf):
        self.ins.append((code, jt, jf, k))

    def ret(self, k: int):
        self.ins.append((_RET_K, 0, 0, k))

    def assemble(self) -> bytes:
        out = b""
        for i, (code, jt, jf, k) in enumerate(self.ins):
            def rel(t):
                if isinstance(t, str):
                    d = self.labels[t] - i - 1
                    if not 0 <= d < 256:
                        raise WallError(f"seccomp jump to {t} out of range")
                    return d
                return t
            out += struct.pack("<HBBI", code, rel(jt), rel(jf), k & 0xFFFFFFFF)
        return out


def _errno(e: int) -> int:
    return SECCOMP_RET_ERRNO | (e & 0xFFFF)


def seccomp_program(allow_exec: bool, deny_writes: bool, arch: dict | None = None, unix_sockets: bool = False) -> bytes:
    """The filter: see the module's docstring. `allow_exec`: execve (its target then limited by Landlock)
    and the vfork-style clone posix_spawn makes; `deny_writes`: the filesystem fallback without Landlock;
    `unix_sockets`: socket(AF_UNIX) allowed (the ncu proof's channel to its profiler), every other family not."""
    a = arch or _arch()
    if a is None:
        raise WallError(f"no seccomp table for {platform.machine()}")
    nr = a["nr"]
    p = _Program()
    p.ld(_OFF_ARCH)
    p.jump(_JEQ_K, a["audit"], 0, "kill")
    p.ld(_OFF_NR)
    if a["x32"] is not None:
        p.jump(_JGE_K, a["x32"], "eperm", 0)  # the x32 ABI's numbers would dodge the table
    checks = []  # (syscall, label)

    def on(name, label):
        if name in nr:
            checks.append((nr[name], label))

    on("socket", "socket" if unix_sockets else "eacces")  # every family: a unix socket could reach a daemon's
    on("clone", "clone")
    on("clone3", "enosys")  # its flags sit in memory seccomp cannot read; libc falls back to clone
    on("openat2", "enosys")  # likewise its flags; libc's open() never uses it
    for name in ("execve", "execveat", "vfork"):
        on(name, "allow" if allow_exec else "eperm")
    on("fork", "eperm")
    for name in ALWAYS_REFUSED:
        on(name, "eperm")
    if deny_writes:
        on("open", "open")
        on("openat", "openat")
        on("creat", "eacces")
        for name in NAMESPACE_CHANGES:
            on(name, "eacces")
    for number, label in checks:
        p.jump(_JEQ_K, number, label, 0)
    p.ret(SECCOMP_RET_ALLOW)
    p.label("clone")
    p.ld(_arg(0))
    p.jump(_JSET_K, CLONE_THREAD, "allow", 0)
    if allow_exec:  # vfork semantics: the child shares the parent's memory and may only exec or exit
        p.jump(_JSET_K, CLONE_VFORK, 0, "eperm")
        p.jump(_JSET_K, CLONE_VM, "allow", "eperm")
    else:
        p.ret(_errno(errno.EPERM))
    if deny_writes:
        p.label("open")
        p.ld(_arg(1))
        p.jump(_JSET_K, O_WRITE_FLAGS, "eacces", "allow")
        p.label("openat")
        p.ld(_arg(2))
        p.jump(_JSET_K, O_WRITE_FLAGS, "eacces", "allow")
    if unix_sockets:
        p.label("socket")
        p.ld(_arg(0))
        p.jump(_JEQ_K, 1, "allow", "eacces")  # AF_UNIX
    p.label("allow")
    p.ret(SECCOMP_RET_ALLOW)
    p.label("eperm")
    p.ret(_errno(errno.EPERM))
    p.label("eacces")
    p.ret(_errno(errno.EACCES))
    p.label("enosys")
    p.ret(_errno(errno.ENOSYS))
    p.label("kill")
    p.ret(SECCOMP_RET_KILL_PROCESS)
    return p.assemble()


def _no_new_privs() -> None:
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise WallError(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")


def _load_seccomp(program: bytes) -> None:
    a = _arch()
    buf = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(program) // 8, ctypes.addressof(buf))
    r = _libc.syscall(a["seccomp"], SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(prog))
    if r != 0:
        e = ctypes.get_errno()
        raise WallError(f"seccomp filter refused: {os.strerror(e) if r < 0 else f'thread {r} could not sync'}")


# --- Landlock ---------------------------------------------------------------------------------------
def _landlock(abi: int, write_dirs: list[str], write_files: list[str], exec_files: list[str]) -> dict:
    a = _arch()
    create, add, restrict = a["landlock"]
    fs_write = (LL_WRITE_FILE | LL_REMOVE_DIR | LL_REMOVE_FILE | LL_MAKE_CHAR | LL_MAKE_DIR | LL_MAKE_REG
                | LL_MAKE_SOCK | LL_MAKE_FIFO | LL_MAKE_BLOCK | LL_MAKE_SYM)
    if abi >= 2:
        fs_write |= LL_REFER
    if abi >= 3:
        fs_write |= LL_TRUNCATE
    handled = fs_write | LL_EXECUTE
    net = (LL_NET_BIND_TCP | LL_NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (LL_SCOPE_ABSTRACT_UNIX | LL_SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("<QQQ", handled, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    abuf = ctypes.create_string_buffer(attr[:size], size)
    fd = _libc.syscall(create, abuf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise WallError(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    file_write = LL_WRITE_FILE | (LL_TRUNCATE if abi >= 3 else 0)
    try:
        rules = [(d, fs_write) for d in write_dirs] + [(f, file_write) for f in write_files] \
            + [(f, LL_EXECUTE) for f in exec_files]
        for path, access in rules:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(struct.pack("<Qi", access, pfd), 12)
                if _libc.syscall(add, fd, LL_RULE_PATH_BENEATH, rule, 0) != 0:
                    raise WallError(f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(pfd)
        if _libc.syscall(restrict, fd, 0) != 0:
            raise WallError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
    return {"net": bool(net), "scoped": bool(scoped)}


def device_files() -> list[str]:
    """Character devices a child keeps opening for writing: /dev/null and the GPU's nodes."""
    return [p for p in ["/dev/null", *sorted(glob.glob("/dev/nvidia*")), *sorted(glob.glob("/dev/dri/*"))]
            if os.path.exists(p) and not os.path.isdir(p)]


def install(write_dirs: list[str], exec_files: list[str] = (), require_landlock: bool = False,
            use_landlock: bool = True, unix_sockets: bool = False) -> dict:
    """Put this process behind the wall. `write_dirs`: the only directories writable from now on;
    `exec_files`: binaries that may still be executed (needs Landlock; without it nothing is).
    Returns which wall guards each of network, process and filesystem."""
    if _arch() is None:
        raise WallError(f"no OS wall for {platform.machine()}")
    dirs = [os.path.realpath(d) for d in write_dirs if os.path.isdir(d)]
    abi = landlock_abi() if use_landlock else 0
    if require_landlock and abi == 0:
        raise WallError("Landlock is not available in this kernel")
    execs = exec_closure(exec_files) if abi else []
    _no_new_privs()
    desc = {"landlock_abi": abi, "exec": execs}
    if abi:
        ll = _landlock(abi, dirs, device_files(), execs)
        desc["filesystem"] = "landlock"
        desc["network"] = "seccomp+landlock" if ll["net"] else "seccomp"
        desc["signals"] = "landlock" if ll["scoped"] else "none"
    else:
        # seccomp cannot read paths: denying writes would refuse the child's own exports and Triton's
        # cache, so every honest candidate would fail; the run-time guard polices writes here
        desc["filesystem"] = "guard only (no Landlock)"
        desc["network"] = "seccomp"
        desc["signals"] = "none"
    # without Landlock an exec cannot be limited to the listed binaries: allowed when there are any (the
    # GPU compiler), the guard then admits only those from Triton's compiler
    allow_exec = bool(execs) if abi else bool(exec_files)
    _load_seccomp(seccomp_program(allow_exec=allow_exec, deny_writes=False, unix_sockets=unix_sockets))
    if unix_sockets:
        desc["sockets"] = "AF_UNIX only (the ncu proof's channel)"
    desc["process"] = ("seccomp+landlock (exec: listed binaries only)" if execs else
                       "seccomp (exec: the guard's list only)" if allow_exec else "seccomp")
    return desc


def enclose(tmp: str, write_roots: list[str], trusted_roots: list[str], cuda: bool,
            report_fd: int | None, mode: str = "on", unix_sockets: bool = False) -> tuple:
    """The candidate child's walls, in order: the guard (audit hook, import blocker, sealed), then the OS
    wall. `mode`, the settings' wall (MARATHON_WALL): `on` (the wall is installed, Landlock where the
    kernel has it, else the seccomp fallback), `landlock` (refuse to run candidates without Landlock),
    `seccomp` (the fallback even where Landlock exists), `off` (an operator's explicit opt-out: the Python
    guard alone). Returns (seal, description of the walls for the load reply)."""
    from gpu_worker import guard

    ptxas, launcher = candidate_exec_files(cuda)
    execs = ptxas + launcher
    seal = guard.install(write_roots=[tmp] + list(write_roots), trusted_roots=list(trusted_roots),
                         report_fd=report_fd, allowed_exec=tuple(ptxas), launcher_exec=tuple(launcher))
    if mode == "off":
        return seal, {"os": "off (MARATHON_WALL=off)"}
    import tempfile

    tempfile.gettempdir()  # resolved (to the child's TMPDIR) while probing it may still write anywhere
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
    desc = install([tmp] + list(write_roots), exec_files=execs, require_landlock=(mode == "landlock"),
                   use_landlock=(mode != "seccomp"), unix_sockets=unix_sockets)
    desc["os"] = "on"
    desc["threads_at_install"] = threads  # Landlock holds for the installing thread and all it starts
    return seal, desc


def family_of(exc: BaseException, write_roots: list[str]) -> str | None:
    """The family of an act the wall refused, read from the OSError it raised (here or in its chain).
    The wall answers with its own errnos: EPERM for process creation and the always-refused calls,
    EACCES for sockets and (from Landlock) for paths outside `write_roots`. So: raised inside subprocess
    or pty code, or EPERM with no path -> process; raised in socket code, or EACCES with no path ->
    network; a path outside the roots -> filesystem. None when the error is not the wall's."""
    import traceback

    roots = [os.path.realpath(r).rstrip("/") + "/" for r in write_roots]
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.EPERM, errno.EACCES):
            files = [f.filename for f in traceback.extract_tb(e.__traceback__)]
            if any(f.endswith(("/subprocess.py", "/popen_fork.py", "/pty.py")) for f in files):
                return "process"
            if any(f.endswith("/socket.py") for f in files):
                return "network"
            paths = [p for p in (e.filename, e.filename2) if isinstance(p, (str, bytes, os.PathLike))]
            for path in paths:
                p = os.path.realpath(os.fsdecode(path))
                if not any((p + "/").startswith(r) for r in roots):
                    return "filesystem"
            if not paths:
                return "process" if e.errno == errno.EPERM else "network"
        e = e.__cause__ or e.__context__
    return None


def host_summary(mode: str = "on") -> str:
    """One line for the worker's start: which wall its candidate children get on this host under `mode`
    (the settings' wall, as for `enclose`)."""
    if mode == "off":
        return "OS wall: OFF (MARATHON_WALL=off): candidates run behind the Python guard only"
    if _arch() is None:
        return f"OS wall: unavailable on {platform.machine()}: candidate children will refuse to load"
    abi = landlock_abi() if mode != "seccomp" else 0
    if abi:
        extra = ", TCP bind/connect" if abi >= 4 else ""
        return (f"OS wall: seccomp (network, processes) + Landlock ABI {abi} (filesystem{extra}"
                f"{', signals' if abi >= 6 else ''})")
    if mode == "landlock":
        return "OS wall: Landlock is absent: candidate children will refuse to load (MARATHON_WALL=landlock)"
    return ("OS wall: seccomp only (no Landlock): network and new processes refused by the kernel; writes "
            "and the GPU compiler's exec policed by the Python guard")
