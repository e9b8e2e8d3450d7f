"""Triton's interpreter keeps its own names out of the candidate's module.

To run a kernel as Python, the interpreter rewrites the kernel's source and executes it among the kernel's
globals, adding its own module's globals there first (numpy, time, inspect, its attribute patcher): they
would then be the candidate module's, reachable by a bare name from any of its functions. Here the rewrite
executes among a copy of those globals instead, so the kernel still finds the interpreter's names and the
candidate's module never holds them. A kernel sees the module's names as they were at its first launch."""

from __future__ import annotations

import types


def keep_kernel_globals_private() -> bool:
    """Wrap the interpreter's rewrite; False where this Triton has no such step (nothing is added then)."""
    try:
        from triton.runtime.interpreter import FunctionRewriter
    except ImportError:
        return False
    original = getattr(FunctionRewriter, "_compile_and_exec", None)
    if original is None:
        return False
    if getattr(original, "keeps_globals_private", False):
        return True

    def compile_and_exec(self, transformed_ast):
        fn = self.fn
        self.fn = types.FunctionType(fn.__code__, dict(fn.__globals__), fn.__name__, fn.__defaults__, fn.__closure__)
        try:
            return original(self, transformed_ast)
        finally:
            self.fn = fn

    compile_and_exec.keeps_globals_private = True
    FunctionRewriter._compile_and_exec = compile_and_exec
    return True
