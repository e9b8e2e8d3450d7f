"""Python sources parsed one at a time in a process: CPython 3.11 keeps the AST conversion's recursion depth
in per-interpreter state, so two conversions at once fail with "SystemError: AST constructor recursion depth
mismatch". Two threads can do that (a GPU worker checks sources in concurrent activities), and so can one: a
garbage collection inside the conversion may run a finalizer whose traceback is formatted, which parses the
source line of each frame."""

from __future__ import annotations

import ast
import gc
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse, one thread at a time and with no collection inside it."""
    with _LOCK:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return ast.parse(source, filename)
        finally:
            if collecting:
                gc.enable()
