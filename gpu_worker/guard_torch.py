"""The run-time guard's hold on torch (gpu_worker.guard installs it): the dispatch guard around each of the
candidate's calls, torch's override stacks, and the entry points that would take the dispatch guard off.

* `dispatch_guard()`: a TorchDispatchMode that lets torch only allocate, view, copy, cast and fill
  (ALLOWED_ATEN_OPS, rules/torch_ops.py); any other aten op computes, and the work must be the candidate's
  own Triton (`library-kernel`). It holds inside the call, not only after it: every op it sees checks that
  torch's dispatch stack is as the guard left it, and, given the call's outputs, it counts the writes it saw
  to each and compares them, when the call returns, with the version counter torch keeps for every tensor:
  a write the guard did not see was made while it was off the stack.
* `seal_dispatch_entries()`: torch's functions and guards that pop a dispatch mode, exclude the Python
  dispatch key or redispatch below it are replaced, in every loaded module, by wrappers that refuse while
  candidate code is on the stack (the originals live in the wrappers' default arguments, which candidate
  code may not read: see guard's audit hook).
* `mode_stacks()`: the function-mode and dispatch-mode stacks and switches, compared after each call.
"""

from __future__ import annotations

import os
import sys

from rules.torch_ops import ALLOWED_ATEN_OPS

#: torch._C entries that take the dispatch guard out of an op's path while it stays on the stack (pop it,
#: exclude the Python key, redispatch below it)
DISPATCH_BYPASSES = ("_pop_torch_dispatch_stack", "_unset_dispatch_mode", "_DisableTorchDispatch",
                     "_ExcludeDispatchKeyGuard", "ExcludeDispatchKeyGuard", "_SetExcludeDispatchKeyGuard",
                     "_ForceDispatchKeyGuard", "_dispatch_tls_set_dispatch_key_excluded",
                     "_dispatch_keyset_full_after", "_pop_torch_function_stack")
#: Triton's interpreter points a kernel's arguments at host copies of their storage (`set_`) and copies
#: them back: only these functions of its file may run aten ops outside the allowlist
INTERPRETER_FILE = os.path.join("triton", "runtime", "interpreter.py")
INTERPRETER_ARG_FUNCTIONS = frozenset({"_to_cpu", "_init_args_hst", "_from_cpu", "_restore_args_dev"})


def seal_dispatch_entries(candidate_on_stack, record) -> int:
    """Replace DISPATCH_BYPASSES wherever a loaded module holds them; returns how many slots. `record(rule,
    detail)` reports and raises. Run once, before the candidate loads."""
    import torch

    C = torch._C
    originals = {id(getattr(C, n)): (n, getattr(C, n)) for n in DISPATCH_BYPASSES if hasattr(C, n)}
    wrappers = {}
    for key, (name, orig) in originals.items():
        def wrapper(*args, _orig=orig, _name=name, _on_stack=candidate_on_stack, _record=record, **kwargs):
            if _on_stack():
                _record("escape", f"torch._C.{_name} called by the candidate: it takes the dispatch guard out of "
                        "torch's ops while they run")
            return _orig(*args, **kwargs)

        wrapper.__name__ = wrapper.__qualname__ = name
        wrappers[key] = wrapper
    n = 0
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for k, v in list(d.items()):
            w = wrappers.get(id(v))
            if w is not None and originals[id(v)][1] is v:
                d[k] = w
                n += 1
    return n


def mode_stacks() -> tuple:
    """Torch's override state: the function-mode and dispatch-mode stack depths, the infrastructure dispatch
    modes, and whether torch-function handling is switched off."""
    import torch

    C = torch._C
    infra = ()
    keys = getattr(C, "_TorchDispatchModeKey", None)
    if keys is not None and hasattr(C, "_get_dispatch_mode"):
        infra = tuple(C._get_dispatch_mode(k) is not None for k in keys.__members__.values())
    state = C._get_torch_function_state() if hasattr(C, "_get_torch_function_state") else None
    return (C._len_torch_function_stack(), C._len_torch_dispatch_stack(), infra, str(state))


def dispatch_guard(allowed: frozenset = ALLOWED_ATEN_OPS, outputs: dict | None = None):
    """A TorchDispatchMode, entered around each of the candidate's calls, that refuses every aten op outside
    `allowed` (allocation, views, copies, casts, fills), every other namespace, and any copy of device data
    to the host (where host code could compute the answer): the outputs must come from the candidate's own
    Triton. Triton's interpreter moving a kernel's arguments is the one exception. With `outputs` (the
    call's output tensors), writes to them the mode did not see are refused when it exits."""
    import torch
    import triton
    from torch.utils._python_dispatch import TorchDispatchMode

    from gpu_worker.guard_record import VIOLATIONS, GuardViolation

    def spellings(path: str) -> tuple[str, ...]:
        return tuple({os.path.realpath(path), os.path.abspath(path)})

    torch_dirs = tuple(d + "/" for d in spellings(os.path.dirname(torch.__file__)))
    interpreter = spellings(os.path.join(os.path.dirname(os.path.dirname(triton.__file__)), INTERPRETER_FILE))
    arg_functions, getframe, tensor, frozen = INTERPRETER_ARG_FUNCTIONS, sys._getframe, torch.Tensor, "<frozen"
    depth, violations, violation = torch._C._len_torch_dispatch_stack, VIOLATIONS, GuardViolation
    no_function_modes = torch._C.DisableTorchFunction
    outs = {k: v for k, v in (outputs or {}).items() if type(v) is tensor}

    def by_interpreter() -> bool:
        """Whether the innermost frame outside torch is one of the interpreter's argument movers."""
        f = getframe(2)
        while f is not None and f.f_code.co_filename.startswith(torch_dirs + (frozen,)):
            f = f.f_back
        return f is not None and f.f_code.co_filename in interpreter and f.f_code.co_name in arg_functions

    def refuse(rule: str, detail: str):
        violations.append((rule, detail))
        raise violation(rule, detail)

    def to_host(args, result) -> bool:
        res = result if isinstance(result, (tuple, list)) else (result,)
        return (any(isinstance(a, tensor) and a.is_cuda for a in args)
                and any(isinstance(r, tensor) and not r.is_cuda for r in res))

    class _OwnTritonOnly(TorchDispatchMode):
        def __enter__(self):
            self.below = depth()  # inside an op the mode itself is off the stack: what lies below it stays
            self.versions = {k: v._version for k, v in outs.items()}
            self.storages = {k: v.untyped_storage().data_ptr() for k, v in outs.items()}
            self.writes = dict.fromkeys(outs, 0)
            return super().__enter__()

        def __exit__(self, *exc):
            out = super().__exit__(*exc)
            if exc[0] is None:
                with no_function_modes():  # a mode the candidate left (lazy-output, seen next) runs nothing here
                    bumped = {k: v._version - self.versions[k] for k, v in outs.items()}
                for k, n in bumped.items():
                    if n > self.writes[k]:
                        refuse("library-kernel", f"output {k!r} was written {n} times by torch during the call, "
                               f"{self.writes[k]} of them with the dispatch guard on: the guard was taken off "
                               "torch's stack while torch computed")
            return out

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if depth() != self.below:
                refuse("escape", f"torch's dispatch stack holds {depth()} modes under the guard where "
                       f"{self.below} were when the call began: a mode was pushed or popped during the call")
            name = func.__name__.split(".")[0]
            ns = getattr(func, "namespace", "aten")
            if (ns != "aten" or name not in allowed) and not by_interpreter():
                what = "reads a tensor's value on the host" if name == "_local_scalar_dense" else "computes in torch"
                refuse("library-kernel", f"{ns}::{name} {what}; a candidate's torch may only allocate, view, copy, "
                       "cast and fill (the work is its own Triton)")
            if outs:
                self._count_writes(func, args, kwargs or {})
            result = func(*args, **(kwargs or {}))
            if to_host(args, result) and not by_interpreter():
                refuse("library-kernel", f"aten::{name} copies device data to the host, where host code could "
                       "compute the answer")
            return result

        def _count_writes(self, func, args, kwargs):
            schema = getattr(func, "_schema", None)
            if schema is None:
                return
            for i, a in enumerate(schema.arguments):
                if a.alias_info is None or not a.alias_info.is_write:
                    continue
                t = args[i] if i < len(args) else kwargs.get(a.name)
                for x in (t if isinstance(t, (list, tuple)) else (t,)):
                    if isinstance(x, tensor):
                        ptr = x.untyped_storage().data_ptr()
                        for k, p in self.storages.items():
                            if p == ptr:
                                self.writes[k] += 1

    return _OwnTritonOnly()
