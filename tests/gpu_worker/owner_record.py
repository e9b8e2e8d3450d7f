"""A recording stand-in for the device: what ran in which device owner's turn, and when, for the owner's
tests (tests/gpu_worker/test_device_owner*.py)."""

from __future__ import annotations

import threading
import time


class Record:
    """What ran on the device and when: a check, at every entry, that nothing overlaps a timing block and
    that at most `max_jobs` jobs run at once."""

    def __init__(self):
        self._mu = threading.Lock()
        self.jobs = self.timing = self.most_jobs = 0
        self.bad: list[str] = []
        self.log: list[tuple[str, float]] = []

    def inside(self, kind: str, name: str, hold: float) -> None:
        with self._mu:
            if kind == "job":
                self.jobs += 1
                self.most_jobs = max(self.most_jobs, self.jobs)
            else:
                self.timing += 1
            if self.timing > 1 or (self.timing and self.jobs):
                self.bad.append(f"{name}: {self.jobs} jobs beside {self.timing} timing blocks")
            self.log.append((name + "+", time.monotonic()))
        time.sleep(hold)
        with self._mu:
            self.log.append((name + "-", time.monotonic()))
            if kind == "job":
                self.jobs -= 1
            else:
                self.timing -= 1

    def at(self, name: str) -> float:
        return next(t for n, t in self.log if n == name)

    def order(self) -> list[str]:
        """The names in the order they went on the device."""
        return [n[:-1] for n, _ in self.log if n.endswith("+")]


def start(fn, *args) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t
