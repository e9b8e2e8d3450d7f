"""Per-thread phase timings of one activity (the phase log) and the heartbeat that waits call.

Used by the protocol (harness) and by the scheduling around it (scheduling), so it lives below both.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

Heartbeat = Callable[[], None] | None

_PHASES = threading.local()


def waiting_heartbeat(hb: Heartbeat) -> None:
    """The activity's heartbeat for this thread: waits for a device turn or a stage call it, so
    that a long wait is not mistaken for a dead worker (Temporal would cancel and retry the activity)."""
    _PHASES.hb = hb


def beat() -> None:
    hb = getattr(_PHASES, "hb", None)
    if hb is not None:
        hb()


def phases_begin() -> None:
    """Start collecting this thread's phase timings (one activity runs on one thread)."""
    _PHASES.d = {}


def phases_end() -> dict:
    """Seconds per phase since `phases_begin` on this thread: gpu-wait / gpu-held (timing blocks), gpu-job-wait /
    gpu-job-held (untimed device jobs) and the named steps below, and counts: gpu-jobs (untimed device jobs),
    gpu-blocks (timing blocks) and gpu-drains (of those, the ones that drained the device of jobs); the activity
    log carries them, which is how the throughput run is read."""
    d, _PHASES.d = getattr(_PHASES, "d", None) or {}, None
    return {k: round(v, 3) for k, v in d.items()}


def add_phase(name: str, seconds: float) -> None:
    d = getattr(_PHASES, "d", None)
    if d is not None:
        d[name] = d.get(name, 0.0) + seconds


def set_rank(rank: int | None) -> None:
    """The rank of this thread's device jobs (gpu_worker.device.turns.UntimedJob): its activity's task
    priority. None: the default."""
    _PHASES.rank = rank


def current_rank() -> int | None:
    return getattr(_PHASES, "rank", None)


def current_phase() -> str | None:
    """The innermost named step this thread is in (`phase`): what a device job under it is, for a scheduler
    that learns how long each kind of job takes (gpu_worker.device.dispatcher)."""
    stack = getattr(_PHASES, "stack", None)
    return stack[-1] if stack else None


class phase:
    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.t = time.monotonic()
        if not hasattr(_PHASES, "stack"):
            _PHASES.stack = []
        _PHASES.stack.append(self.name)

    def __exit__(self, *exc):
        _PHASES.stack.pop()
        add_phase(self.name, time.monotonic() - self.t)
        return False
