"""Run-time guard installed in a sandbox child before the candidate module loads.

The operating system is the wall (gpu_worker.wall: seccomp and Landlock); this guard gives early,
readable rejections that name the family, however the act was reached (importlib, __import__, a string
built at run time):

* a CPython audit hook (PEP 578, cannot be removed once added) that refuses
  - imports of kernel libraries and of the project's own modules (`import` event),
  - file writes outside the allowed roots (the child's temp dir)                          -> filesystem
  - subprocesses, exec, fork, unless Triton's compiler runs one of the allowed binaries   -> process
  - sockets (but AF_UNIX ones, whose connect is refused), connect, bind, sendto, lookups -> network
  - ctypes/dlopen while candidate code is on the stack                                    -> escape
  - the candidate reaching frames (sys._getframe, a generator's, coroutine's or traceback's frame),
    objects by the garbage collector, functions' code and defaults, or installing trace, profile or
    audit hooks of its own                                                                -> escape
* `sys.modules` audits after load and after each call (anything kernel-library-like that appeared);
* the torch function-mode and dispatch-mode stacks, compared after load and after each call with what
  they were before the candidate existed: a mode left behind completes outputs lazily  -> lazy-output
* a TorchDispatchMode around the candidate's calls that lets torch only allocate, view, copy, cast and
  fill (ALLOWED_ATEN_OPS, rules/torch_ops.py): any other aten op computes, and the work must be the
  candidate's own Triton; torch's entries that would take it off during a call refuse the candidate
  (gpu_worker.guard_torch)                                                                -> library-kernel

A call is trusted only when no frame on the stack is candidate code (a frame outside the standard
library, site-packages and the harness's own directories); a frame merely inside torch is not enough.

The guard's settings are frozen when it is installed and held in the hook's closure; `install` returns a
`Seal` that the harness keeps and checks after every call (`Seal.broken`), by identity, from code the
candidate never sees. Every refusal is recorded in `VIOLATIONS` and, as one line, written at once to a
pipe whose reading end lives in the worker (sandbox.Sandbox): a candidate that swallows the exception
or empties the list is still rejected with the family named.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import sysconfig
import types

from gpu_worker.guard_torch import dispatch_guard, mode_stacks, seal_dispatch_entries  # noqa: F401 - the guard's parts
from gpu_worker.guard_record import VIOLATIONS, GuardViolation  # noqa: F401 - the guard's record

BANNED_TOP = ("fla", "flash_attn", "flashinfer", "xformers", "sglang", "vllm", "deep_gemm", "flash_mla",
              "liger_kernel", "tilelang", "flash_kda", "cutlass", "apex", "transformer_engine", "baselines",
              "gpu_worker", "activities", "workflows", "rules", "cli")
SUBPROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                     "os.forkpty", "pty.spawn", "os.startfile")
SOCKET_EVENTS = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                 "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo")
#: the Triton files whose subprocesses are the compiler's own (ptxas, the driver module's C compiler)
COMPILER_FILES = ("triton/backends/nvidia/compiler.py", "triton/runtime/build.py", "triton/knobs.py",
                  "triton/backends/nvidia/driver.py")
#: the launcher build: a C compiler runs only from Triton's build helper called by its NVIDIA driver (the
#: launcher's source is generated from the kernel's signature there, not passed in by the candidate)
LAUNCHER_BUILD, LAUNCHER_CALLER = "triton/runtime/build.py", "triton/backends/nvidia/driver.py"
CTYPES_EVENTS = ("ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof", "ctypes.call_function",
                 "ctypes.string_at", "ctypes.wstring_at")
#: reaching frames and objects the candidate was not handed: refused when the candidate itself asks (the
#: innermost frame outside the standard library is its own); `object.__getattr__` only for FRAME_ATTRS
INTROSPECTION_EVENTS = ("sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers",
                        "gc.get_referents", "object.__getattr__", "object.__setattr__", "object.__delattr__")
#: code made at run time: refused when the candidate's own frame makes it (an import's compile and exec
#: are the import system's)
CODE_EVENTS = ("exec", "compile", "code.__new__", "function.__new__")
FRAME_ATTRS = ("gi_frame", "cr_frame", "ag_frame", "tb_frame", "__defaults__", "__kwdefaults__", "__code__",
               "gi_code", "cr_code", "ag_code")
#: code of the candidate's own run by the interpreter at other times: refused while its code is on the stack
INTERPRETER_HOOK_EVENTS = ("sys.settrace", "sys.setprofile", "sys.addaudithook")


def _library_prefixes() -> tuple[str, ...]:
    """Directories whose code is not the candidate's: the standard library, site-packages, the harness."""
    paths = sysconfig.get_paths()
    here = os.path.dirname(os.path.realpath(__file__))
    # both spellings: a frame's co_filename keeps the path it was imported by, which may run through a link
    found = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)]
    roots = {os.path.realpath(p) for p in found} | {os.path.abspath(p) for p in found}
    roots |= {here, os.path.join(os.path.dirname(here), "baselines")}
    return tuple(sorted(r.rstrip("/") + "/" for r in roots))


def _stdlib_prefixes() -> set[str]:
    paths = sysconfig.get_paths()
    found = [paths[k] for k in ("stdlib", "platstdlib") if paths.get(k)]
    return {p.rstrip("/") + "/" for p in {os.path.realpath(p) for p in found} | {os.path.abspath(p) for p in found}}


def _make_hook(cfg: tuple, violations: list, report_fd: int | None):
    """The audit hook and its helpers, closed over frozen settings: nothing here reads a module global
    at call time, so rewriting this module's attributes changes nothing the hook does."""
    roots, trusted_roots, library, compiler_files, allowed_exec, banned, launcher_exec = cfg
    launcher_build, launcher_caller = LAUNCHER_BUILD, LAUNCHER_CALLER
    realpath, getframe, write, dumps = os.path.realpath, sys._getframe, os.write, json.dumps
    fspath, pathlike, devnull, violation = os.fspath, os.PathLike, os.devnull, GuardViolation
    subprocess_events, socket_events, ctypes_events = SUBPROCESS_EVENTS, SOCKET_EVENTS, CTYPES_EVENTS
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    frozen = "<frozen"
    introspection, hooks_of_interpreter, frame_attrs = INTROSPECTION_EVENTS, INTERPRETER_HOOK_EVENTS, FRAME_ATTRS
    code_events = CODE_EVENTS

    def is_write(mode, flags) -> bool:
        if isinstance(mode, str):
            return any(c in mode for c in "wax+")
        return isinstance(flags, int) and bool(flags & write_flags)

    def report(rule: str, detail: str):
        violations.append((rule, detail))
        if report_fd is not None:
            try:
                write(report_fd, (dumps([rule, detail[:1500]]) + "\n").encode())
            except OSError:  # the worker's end is full or gone: the reply's list still carries it
                pass

    def record(rule: str, detail: str):
        report(rule, detail)
        raise violation(rule, detail)

    # Every walk starts at the frame that raised the event (the hook's caller: `me().f_back`). The hook's own
    # sys._getframe(0) raises a nested event whose frame is the hook's, which the hook ignores.
    def me():
        return getframe(0).f_back

    me_code = me.__code__

    def candidate_on_stack(f=None) -> bool:
        f = me().f_back.f_back if f is None else f
        while f is not None:
            fn = f.f_code.co_filename
            if not (fn.startswith(frozen) or any(fn.startswith(p) for p in library)):
                return True
            f = f.f_back
        return False

    def on_stack(f, suffix: str) -> bool:
        while f is not None:
            if f.f_code.co_filename.endswith(suffix):
                return True
            f = f.f_back
        return False

    def first_caller(f) -> str:
        """The file of the innermost frame outside the standard library."""
        while f is not None:
            fn = f.f_code.co_filename
            if fn.startswith(frozen) or (fn.startswith(library_stdlib) and not any(p in fn for p in packages)):
                f = f.f_back
                continue
            return fn
        return ""

    def by_candidate(f) -> bool:
        """Whether the innermost frame outside the standard library proper is candidate code: what torch,
        Triton or the harness do for themselves (a warning's frame, the interpreter's introspection) is theirs."""
        while f is not None:
            fn = f.f_code.co_filename
            if fn.startswith(frozen) or (fn.startswith(stdlib) and not any(p in fn for p in packages)):
                f = f.f_back
                continue
            return not any(fn.startswith(p) for p in library)
        return False

    # a venv's platstdlib holds its site-packages: a frame there is a package's, not the standard library's
    packages = ("/site-packages/", "/dist-packages/")
    library_stdlib = tuple(p for p in library if not any(q.strip("/") in p for q in packages))
    stdlib = tuple(p for p in library_stdlib if p in _stdlib_prefixes())

    def under(path, where) -> bool:
        try:
            p = realpath(path)
        except Exception:  # noqa: BLE001
            return False
        return any(p == r or p.startswith(r.rstrip("/") + "/") for r in where)

    def hook(event: str, args):
        if event == "sys._getframe" and args[0].f_code is me_code:
            return  # the hook's own walk (`me`)
        if event in introspection:
            if (event != "object.__getattr__" or args[1] in frame_attrs) and by_candidate(me().f_back):
                what = f"{args[1]} read" if event == "object.__getattr__" else event
                record("escape", f"{what} refused: a candidate may not reach the harness's frames, objects "
                       "or functions")
            return
        if event in code_events:
            f = me().f_back
            fn = f.f_code.co_filename if f is not None else frozen
            if not (fn.startswith(frozen) or any(fn.startswith(p) for p in library)):
                record("escape", f"{event} refused: a candidate may not make code at run time")
            return
        if event in hooks_of_interpreter:
            if candidate_on_stack(me().f_back):
                record("escape", f"{event} refused: a candidate may not run code of its own inside the harness's")
            return
        if event == "import":
            name = args[0] or ""
            if name.split(".")[0] in banned and candidate_on_stack(me().f_back):
                record("forbidden-import", f"run-time import of {name!r}")
        elif event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            if isinstance(path, int) or path is None:
                return
            if isinstance(path, bytes):
                path = path.decode(errors="replace")
            if not is_write(mode, flags) or path == devnull:
                return
            if under(path, roots):
                return
            if under(path, trusted_roots) and not candidate_on_stack(me().f_back):
                return
            record("filesystem", f"write to {path!r} outside the sandbox's temp directory")
        elif event in subprocess_events or event.startswith("os.exec") or event.startswith("os.spawn"):
            exe = args[0] if args else None
            if exe is None and len(args) > 1 and isinstance(args[1], (list, tuple)) and args[1]:
                exe = args[1][0]  # Popen's executable defaults to the first argument
            if isinstance(exe, pathlike):
                exe = fspath(exe)
            if isinstance(exe, bytes):
                exe = exe.decode(errors="replace")
            real = realpath(exe) if isinstance(exe, str) else None
            ok_exe = real in allowed_exec
            caller = first_caller(me().f_back)
            if real in launcher_exec:
                by_compiler = caller.endswith(launcher_build) and on_stack(me().f_back, launcher_caller)
            else:
                by_compiler = any(caller.endswith(c) for c in compiler_files)
            if not (ok_exe and by_compiler) and candidate_on_stack(me().f_back):
                why = "" if ok_exe else ", not a listed compiler binary"
                record("process", f"{event} of {exe!r} from {caller or '?'}{why} refused: candidates may not "
                       "start processes")
        elif event == "socket.__new__":
            fam = args[1] if len(args) > 1 else None
            if fam != 1:  # AF_UNIX: its connect and bind are refused below
                record("network", f"socket of family {fam} refused: candidates may not use the network")
        elif event in socket_events:
            record("network", f"{event} refused: candidates may not use the network")
        elif event in ctypes_events:
            if candidate_on_stack(me().f_back):
                record("escape", f"{event} refused")

    class ImportBlocker:
        """First entry of sys.meta_path: importlib.import_module and friends bypass the `import` audit
        event (it is raised only by the C import path), but every import consults sys.meta_path."""

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in banned and candidate_on_stack(getframe(1)):
                report("forbidden-import", f"run-time import of {name!r}")
                raise ImportError(f"[forbidden-import] run-time import of {name!r} refused by the sandbox")
            return None

    return hook, ImportBlocker(), report, candidate_on_stack, record


def _cells(f) -> tuple:
    out = []
    for c in f.__closure__ or ():
        try:
            out.append(c.cell_contents)
        except ValueError:  # an empty cell
            out.append(None)
    return tuple(out)


def _closure_functions(f, depth: int = 3) -> list:
    """`f` and the functions its closure holds, to `depth`."""
    seen, todo = [], [(f, 0)]
    while todo:
        g, d = todo.pop()
        if any(g is s for s in seen):
            continue
        seen.append(g)
        if d < depth:
            todo += [(c, d + 1) for c in _cells(g) if callable(c) and hasattr(c, "__code__")]
    return seen


class Seal:
    """What the guard was when it was installed, kept by the harness: `broken()` names what changed
    (the hook, the import blocker, the violations list, the torch mode stacks), checked by identity."""

    def __init__(self, hook, blocker, report, violations: list, cfg: tuple, modes: tuple):
        self.hook, self.blocker, self.violations, self.cfg, self.modes = hook, blocker, violations, cfg, modes
        self.report = report  # records a refusal seen elsewhere (the OS wall's, see child.loading.ChildLoading._call)
        self.find_spec = type(blocker).find_spec
        self.functions = _closure_functions(hook) + _closure_functions(self.find_spec)
        self.snapshot = [(f, f.__code__, _cells(f)) for f in self.functions]  # held: their ids stay theirs
        self.module = sys.modules[__name__]
        self.builtins = dict(vars(builtins))  # the hook, like all code, looks builtins up when it runs
        self.seen = 0  # violations counted at the last check: the list never shrinks

    def library_object(self, obj) -> bool:
        """Whether the Python code `obj` would run (a function's, or the methods of a class or of an
        object's class) is all the standard library's, site-packages' or the harness's, by the files it
        was compiled from (candidate code may not compile code of its own: the audit hook)."""
        f = getattr(obj, "__func__", obj)
        if isinstance(f, types.FunctionType):
            codes = [f.__code__]
        else:
            cls = obj if isinstance(obj, type) else type(obj)
            codes = [getattr(v, "__func__", v).__code__ for c in cls.__mro__[:-1] for v in list(vars(c).values())
                     if isinstance(getattr(v, "__func__", v), types.FunctionType)]
        return all(c.co_filename.startswith("<frozen") or any(c.co_filename.startswith(p) for p in self.cfg[2])
                   for c in codes)

    def broken(self) -> list[tuple[str, str]]:
        # builtins first, with no builtin called: the checks below (and the hook) use them
        changed, now_builtins = [], builtins.__dict__
        for k, v in self.builtins.items():
            if now_builtins.get(k) is not v:
                changed.append(k)
        if changed:
            return [("escape", "builtins replaced by the candidate: " + ", ".join(changed[:8]))]
        out = []
        for f, code, cells in self.snapshot:
            now = _cells(f)
            if f.__code__ is not code or len(now) != len(cells) or any(a is not b for a, b in zip(now, cells)):
                out.append(("escape", f"the guard's {f.__name__} was modified"))
                break
        if getattr(self.blocker.find_spec, "__func__", None) is not self.find_spec:
            out.append(("escape", "the guard's import blocker was modified"))
        first = next((i for i, m in enumerate(sys.meta_path) if m is self.blocker), None)
        if first is None or any(not self.library_object(m) for m in sys.meta_path[:first]):
            out.append(("escape", "the guard's import blocker was removed or bypassed in sys.meta_path"))
        if sys.modules.get(__name__) is not self.module or getattr(self.module, "VIOLATIONS", None) is not self.violations:
            out.append(("escape", "the guard's module or its violations list was replaced"))
        if len(self.violations) < self.seen:
            out.append(("escape", "recorded violations were removed"))
        self.seen = len(self.violations)
        now = mode_stacks()
        if now != self.modes:
            out.append(("lazy-output", f"torch modes left active by the candidate (function/dispatch stacks "
                                       f"{now[:2]} where {self.modes[:2]} were before it loaded)"))
        return out


_INSTALLED: Seal | None = None


def install(write_roots: list[str], trusted_roots: list[str], report_fd: int | None = None,
            allowed_exec: tuple[str, ...] = (), launcher_exec: tuple[str, ...] = ()) -> Seal:
    """Add the audit hook (once per process). `write_roots` may be written by anyone, `trusted_roots`
    only while no candidate code is on the stack; `allowed_exec`: the binaries Triton's compiler may still
    run while candidate code is on the stack (none on CPU), of which `launcher_exec` (the C compiler and
    its programs) only from Triton's launcher build. Returns the seal the harness checks after every
    call."""
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    if report_fd is not None:
        os.set_blocking(report_fd, False)  # a full pipe drops a line instead of hanging the child
    cfg = (tuple(os.path.realpath(r) for r in write_roots), tuple(os.path.realpath(r) for r in trusted_roots),
           _library_prefixes(), COMPILER_FILES,
           frozenset(os.path.realpath(p) for p in tuple(allowed_exec) + tuple(launcher_exec)),
           frozenset(BANNED_TOP), frozenset(os.path.realpath(p) for p in launcher_exec))
    hook, blocker, report, candidate_on_stack, record = _make_hook(cfg, VIOLATIONS, report_fd)
    sys.meta_path.insert(0, blocker)
    sys.addaudithook(hook)
    seal_dispatch_entries(candidate_on_stack, record)
    _INSTALLED = Seal(hook, blocker, report, VIOLATIONS, cfg, mode_stacks())
    return _INSTALLED


def audit_modules(before: set[str]) -> None:
    """Refuse kernel libraries that appeared in sys.modules since `before` (however they were loaded)."""
    for name in set(sys.modules) - before:
        top = name.split(".")[0]
        if top in BANNED_TOP and top not in ("baselines", "gpu_worker", "activities", "workflows", "rules", "cli"):
            VIOLATIONS.append(("forbidden-import", f"module {name!r} was loaded by the candidate"))
            raise GuardViolation("forbidden-import", f"module {name!r} was loaded by the candidate")
