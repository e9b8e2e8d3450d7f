"""Python sources parsed one at a time in a process: CPython 3.11 keeps the AST conversion's recursion depth
in per-interpreter state, so two threads converting at once can fail with "SystemError: AST constructor
recursion depth mismatch" (a GPU worker checks sources in concurrent activities; seen there, under load)."""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename)
