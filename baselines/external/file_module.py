"""A problem file run as a Python module, and the names the KernelBench format asks of it checked
(baselines/external/file.py describes the format)."""

from __future__ import annotations

import math
import sys
import types

from baselines.problem import ProblemFileError


def positive_number(mod, name: str, label: str) -> float | None:
    """The module's `name` as a positive finite number, None where the file leaves it out; ProblemFileError
    otherwise."""
    v = getattr(mod, name, None)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ProblemFileError(f"{label}: {name} must be a positive number, got {v!r}")
    return float(v)


def load_module(data: bytes, label: str, name: str) -> types.ModuleType:
    """The file executed as the module `name`, its required names checked. Raises ProblemFileError."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ProblemFileError(f"{label}: not a UTF-8 Python file") from None
    try:
        code = compile(text, label, "exec")
    except SyntaxError as e:
        raise ProblemFileError(f"{label}: syntax error at line {e.lineno}: {e.msg}") from None
    mod = types.ModuleType(name)
    mod.__file__ = label
    sys.modules[name] = mod  # classes defined there name their module (pickling, torch.compile)
    try:
        exec(code, mod.__dict__)
    except Exception as e:  # noqa: BLE001 - whatever the file raises is the file's fault, said in one line
        sys.modules.pop(name, None)
        raise ProblemFileError(f"{label}: running the file raised {type(e).__name__}: {e}") from None
    import torch

    model = getattr(mod, "Model", None)
    if not (isinstance(model, type) and issubclass(model, torch.nn.Module)):
        raise ProblemFileError(f"{label}: defines no class Model(nn.Module)")
    if not callable(getattr(mod, "get_inputs", None)):
        raise ProblemFileError(f"{label}: defines no get_inputs()")
    for opt in ("get_init_inputs", "get_cpu_inputs", "get_cpu_init_inputs"):
        if getattr(mod, opt, None) is not None and not callable(getattr(mod, opt)):
            raise ProblemFileError(f"{label}: {opt} must be a function")
    for n in ("FLOPS", "BYTES_MOVED", "TOLERANCE_FLOOR", "TOLERANCE_ALPHA"):
        positive_number(mod, n, label)
    return mod
