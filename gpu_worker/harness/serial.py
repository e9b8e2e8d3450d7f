"""The Evaluator's default scheduler, for one caller at a time (`SerialScheduler`): no device owner, no
warm spares, no hand-on of loaded children, no core pinning."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

from gpu_worker.sandbox import Sandbox
from gpu_worker.settings import GpuWorkerSettings


class NoOwner:
    """The device owner of a serial caller: nothing to wait for, no stage is retried alone. `job(also=lock)`
    still takes `lock` (a reference child serves one call at a time)."""

    retries_alone = False

    def job(self, also: threading.Lock | None = None):
        return also if also is not None else contextlib.nullcontext()

    def timing(self):
        return contextlib.nullcontext()

    def stage(self):
        return contextlib.nullcontext()

    def alone(self, on_start=None):
        return contextlib.nullcontext()


class FreshChildren:
    """A new candidate child for every acquire: no warm spares."""

    def __init__(self, interpreter: bool, settings: GpuWorkerSettings | None = None):
        self.interpreter, self.settings = interpreter, settings

    def acquire(self) -> Sandbox:
        return Sandbox("candidate", self.interpreter, settings=self.settings)

    def shed(self) -> int:
        return 0  # nothing idle is kept

    def close(self) -> None:
        pass


class NoHandOn:
    """No loaded child waits between stages: each stage loads its candidate in a child of its own."""

    @contextlib.contextmanager
    def admission(self, hb=None):
        yield 0.0

    def put(self, key, sb: Sandbox, parked: bool = False) -> None:
        sb.close()

    def take(self, key) -> Sandbox | None:
        return None

    def __len__(self) -> int:
        return 0

    def close(self) -> None:
        pass


class SerialScheduler:
    """The Evaluator's default scheduler, for one caller at a time: no device owner, no warm spares, no
    hand-on of loaded children, no core pinning. The GPU worker, which runs many evaluations at once,
    passes gpu_worker.device.scheduling.Scheduler instead; the verdicts are the same.

    The interface: `owner` (job(also=) / timing / stage / alone / retries_alone, as
    device.owner.DeviceOwner), `loaded` (put / take / close / len), `pool(interpreter, ready, settings)`
    (acquire / close), `spawn(role, interpreter, settings)` and `pin(children, timed)`; `settings` are the
    Evaluator's, for the children (sandbox.Sandbox)."""

    def __init__(self):
        self.owner = NoOwner()
        self.loaded = NoHandOn()

    def pool(self, interpreter: bool, ready: Callable[[Sandbox], None] | None,
             settings: GpuWorkerSettings | None = None) -> FreshChildren:
        return FreshChildren(interpreter, settings)

    def spawn(self, role: str, interpreter: bool, settings: GpuWorkerSettings | None = None) -> Sandbox:
        return Sandbox(role, interpreter, settings=settings)

    def pin(self, children, timed: bool) -> None:
        pass
