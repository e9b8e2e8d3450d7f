"""Triton's interpreter keeps its own names out of the candidate's reach.

To run a kernel as Python, the interpreter rewrites the kernel's source and executes it among the kernel's
globals, having first added there every global of its own module (numpy, time, inspect, its attribute
patcher): a name the candidate's module lacks would then be the interpreter's, in its kernels and, through
the module, its host code. Here a rewritten kernel executes among a copy of its module's globals with only
the names the rewrite itself introduced (its helpers) added from the interpreter's; a name the kernel's own
code reads and its module lacks stays undefined. The kernel sees the module's names as at its first launch."""

from __future__ import annotations

import ast


def keep_kernel_globals_private() -> bool:
    """Replace the interpreter's compile-and-execute step; False where this Triton has no such step."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    rewriter = getattr(interpreter, "FunctionRewriter", None)
    if rewriter is None or not hasattr(rewriter, "_compile_and_exec"):
        return False
    if getattr(rewriter._compile_and_exec, "keeps_globals_private", False):
        return True
    helpers = vars(interpreter)

    def compile_and_exec(self, transformed_ast):
        fn = self.fn
        code = fn.__code__
        own = {*code.co_names, *code.co_varnames, *code.co_cellvars, *code.co_freevars}
        introduced = {n.id for n in ast.walk(transformed_ast) if isinstance(n, ast.Name)} - own
        namespace = dict(fn.__globals__)
        namespace.update({k: helpers[k] for k in introduced if k in helpers and k not in namespace})
        local = dict(self.kwargs)
        exec(compile(transformed_ast, filename=self.filename, mode="exec"), namespace, local)
        return local[fn.__name__]

    compile_and_exec.keeps_globals_private = True
    rewriter._compile_and_exec = compile_and_exec
    return True
