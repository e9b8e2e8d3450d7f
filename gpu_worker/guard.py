"""Run-time guard installed in a sandbox child before the candidate module loads.

Static rules (gpu_worker.rules) see the source; this guard sees what actually happens, however it was
reached (importlib, __import__, a string built at run time):

* a CPython audit hook (PEP 578, cannot be removed once added) that refuses
  - imports of kernel libraries and of the project's own modules (`import` event),
  - file writes outside the allowed roots (the child's temp dir; Triton's cache only from Triton's own frames),
  - subprocesses, exec, fork, unless Triton's compiler is the caller (ptxas, the launcher's C compiler),
  - sockets (connect, bind, sendto, getaddrinfo),
  - ctypes/dlopen, unless torch or Triton is the caller;
* `sys.modules` audits after load and after each call (anything kernel-library-like that appeared);
* a TorchDispatchMode used around verification calls that refuses the aten ops that are library kernels
  for the operator's core (matmul family, SDPA/flash attention, the problem's own op).

Every refusal is also recorded in `VIOLATIONS`, so a candidate that swallows the exception is still
rejected with the rule named.
"""

from __future__ import annotations

import os
import sys
import sysconfig

VIOLATIONS: list[tuple[str, str]] = []
_STATE = {"active": False, "roots": (), "trusted_roots": (), "trusted_dirs": (), "stdlib": ""}

BANNED_TOP = ("fla", "flash_attn", "flashinfer", "xformers", "sglang", "vllm", "deep_gemm", "flash_mla",
              "liger_kernel", "tilelang", "flash_kda", "cutlass", "apex", "transformer_engine", "baselines",
              "gpu_worker", "activities", "workflows")
SUBPROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                     "os.forkpty", "pty.spawn", "os.startfile")
SOCKET_EVENTS = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                 "socket.gethostbyname")
#: aten ops that are library kernels; problem-specific additions come from the parent
ATEN_BANNED = ("mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "einsum", "_scaled_mm",
               "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
               "scaled_dot_product_attention", "_flash_attention_forward", "_efficient_attention_forward",
               "addmv", "mv", "dot", "vdot", "convolution", "_convolution", "cudnn_convolution")


class GuardViolation(RuntimeError):
    def __init__(self, rule: str, detail: str):
        super().__init__(f"[{rule}] {detail}")
        self.rule = rule


def _violate(rule: str, detail: str):
    VIOLATIONS.append((rule, detail))
    raise GuardViolation(rule, detail)


def _caller_trusted() -> bool:
    """True when the innermost frame outside the standard library and this module belongs to
    torch, Triton or the harness itself (not to the candidate)."""
    f = sys._getframe(2)
    stdlib = _STATE["stdlib"]
    here = __file__
    while f is not None:
        fn = f.f_code.co_filename
        if fn == here or fn.startswith(stdlib) or fn.startswith("<frozen"):
            f = f.f_back
            continue
        return any(fn.startswith(d) for d in _STATE["trusted_dirs"])
    return True


def _under(path: str, roots) -> bool:
    try:
        p = os.path.realpath(path)
    except Exception:
        return False
    return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)


def _is_write(mode, flags) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    if isinstance(flags, int):
        return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
    return False


def _hook(event: str, args):
    if not _STATE["active"]:
        return
    if event == "import":
        name = args[0] or ""
        if name.split(".")[0] in BANNED_TOP and not _caller_trusted():
            _violate("forbidden-import", f"run-time import of {name!r}")
    elif event == "open":
        path, mode, flags = (list(args) + [None, None, None])[:3]
        if isinstance(path, int) or path is None:
            return
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        if not _is_write(mode, flags) or path == os.devnull:
            return
        if _under(path, _STATE["roots"]):
            return
        if _under(path, _STATE["trusted_roots"]) and _caller_trusted():
            return
        _violate("escape", f"write to {path!r} outside the sandbox's temp directory")
    elif event in SUBPROCESS_EVENTS or event.startswith("os.exec") or event.startswith("os.spawn"):
        if not _caller_trusted():
            _violate("thread", f"{event} refused: candidates may not start processes")
    elif event in SOCKET_EVENTS:
        _violate("thread", f"{event} refused: candidates may not use the network")
    elif event in ("ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof", "ctypes.call_function"):
        if not _caller_trusted():
            _violate("escape", f"{event} refused")


class _ImportBlocker:
    """First entry of sys.meta_path: importlib.import_module and friends bypass the `import` audit
    event (it is raised only by the C import path), but every import consults sys.meta_path."""

    def find_spec(self, name, path=None, target=None):
        if _STATE["active"] and name.split(".")[0] in BANNED_TOP and not _caller_trusted():
            VIOLATIONS.append(("forbidden-import", f"run-time import of {name!r}"))
            raise ImportError(f"[forbidden-import] run-time import of {name!r} refused by the sandbox")
        return None

    def find_module(self, name, path=None):  # pragma: no cover - legacy protocol
        return None


_INSTALLED = False


def install(write_roots: list[str], trusted_roots: list[str]) -> None:
    """Add the audit hook (once per process) and activate it. `write_roots` may be written by anyone,
    `trusted_roots` (Triton's cache) only by torch/Triton/harness frames."""
    global _INSTALLED
    import torch
    import triton

    _STATE["roots"] = tuple(os.path.realpath(r) for r in write_roots)
    _STATE["trusted_roots"] = tuple(os.path.realpath(r) for r in trusted_roots)
    here = os.path.dirname(os.path.realpath(__file__))
    _STATE["trusted_dirs"] = tuple(
        os.path.dirname(os.path.realpath(m.__file__)) + "/" for m in (torch, triton)
    ) + (here + "/", os.path.join(os.path.dirname(here), "baselines") + "/")
    _STATE["stdlib"] = os.path.realpath(sysconfig.get_paths()["stdlib"])
    if not _INSTALLED:
        sys.meta_path.insert(0, _ImportBlocker())
        sys.addaudithook(_hook)
        _INSTALLED = True
    _STATE["active"] = True


def audit_modules(before: set[str]) -> None:
    """Refuse kernel libraries that appeared in sys.modules since `before` (however they were loaded)."""
    for name in set(sys.modules) - before:
        top = name.split(".")[0]
        if top in BANNED_TOP and top not in ("baselines", "gpu_worker", "activities", "workflows"):
            _violate("forbidden-import", f"module {name!r} was loaded by the candidate")


def dispatch_guard(extra_ops: tuple[str, ...] = ()):
    """A TorchDispatchMode that refuses library-kernel aten ops while a verification call runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    banned = set(ATEN_BANNED) | set(extra_ops)

    class _NoLibraryKernels(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            ns = getattr(func, "namespace", "aten")
            if ns != "aten" and ns != "prims":
                _violate("library-kernel", f"op {ns}::{name} is a library kernel")
            if name in banned:
                _violate("library-kernel", f"aten::{name} is a library kernel for the operator's core")
            return func(*args, **(kwargs or {}))

    return _NoLibraryKernels()
