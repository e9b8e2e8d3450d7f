"""The Evaluator's default scheduler, for one caller at a time (`SerialScheduler`): no GPU gate, no
device-memory admission, no warm spares, no hand-on of loaded children, no core pinning."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

from gpu_worker.sandbox import Sandbox


class NoGate:
    """The GPU gate of a serial caller: nothing to wait for. `shared(also=lock)` still takes `lock` (a
    reference child serves one call at a time)."""

    def shared(self, also: threading.Lock | None = None):
        return also if also is not None else contextlib.nullcontext()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FreshChildren:
    """A new candidate child for every acquire: no warm spares."""

    def __init__(self, interpreter: bool):
        self.interpreter = interpreter

    def acquire(self) -> Sandbox:
        return Sandbox("candidate", self.interpreter)

    def close(self) -> None:
        pass


class NoHandOn:
    """No loaded child waits between stages: each stage loads its candidate in a child of its own."""

    def put(self, key, sb: Sandbox) -> None:
        sb.close()

    def take(self, key) -> Sandbox | None:
        return None

    def reserved(self) -> int:
        return 0

    def __len__(self) -> int:
        return 0

    def close(self) -> None:
        pass


class SerialScheduler:
    """The Evaluator's default scheduler, for one caller at a time: no GPU gate, no device-memory admission,
    no warm spares, no hand-on of loaded children, no core pinning. The GPU worker, which runs many
    evaluations at once, passes gpu_worker.scheduling.Scheduler instead; the verdicts are the same.

    The interface: `gate` (`with gate:` the exclusive side, `gate.shared(also=)` the shared side),
    `loaded` (put / take / reserved / close / len), `memory(carried)` (an admission with hold / alone /
    learn / total, or None), `pool(interpreter, ready)` (acquire / close), `spawn(role, interpreter)` and
    `pin(children, timed)`."""

    def __init__(self):
        self.gate = NoGate()
        self.loaded = NoHandOn()

    def memory(self, carried: Callable[[], int]):
        return None

    def pool(self, interpreter: bool, ready: Callable[[Sandbox], None] | None) -> FreshChildren:
        return FreshChildren(interpreter)

    def spawn(self, role: str, interpreter: bool) -> Sandbox:
        return Sandbox(role, interpreter)

    def pin(self, children, timed: bool) -> None:
        pass
