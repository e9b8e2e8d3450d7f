"""The GPU worker's self-test verdict, held by its Evaluator (`Evaluator.selftest_verdict`, settled by
Evaluator.selftest) and read by the activities: after a failed verdict the worker refuses all work, and
while a start-up self-test is still running its timed work waits here for the verdict."""

from __future__ import annotations

import threading
import time
from typing import Callable


class SelfTestVerdict:
    """Pending until `settle` gives it a self-test's result (run_canaries' dict: ok, problems); a later
    `settle` replaces it, so a later pass lifts a refusal and a later failure imposes one."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: dict = {}

    def settle(self, result: dict) -> None:
        self._result = result  # one reference swapped: readers see the old result or the new, never a mix
        self._done.set()

    @property
    def settled(self) -> bool:
        return self._done.is_set()

    @property
    def passed(self) -> bool:
        return self._done.is_set() and bool(self._result.get("ok"))

    @property
    def failed(self) -> bool:
        return self._done.is_set() and not self._result.get("ok")

    @property
    def problems(self) -> list[str]:
        return list(self._result.get("problems") or [])

    def wait(self, timeout: float, heartbeat: Callable[[], None] | None = None) -> bool:
        """Until the verdict (True: passed), calling `heartbeat` every second meanwhile; TimeoutError after
        `timeout` seconds without one."""
        deadline = time.monotonic() + timeout
        while not self._done.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the GPU worker's self-test gave no verdict within {timeout:g} s")
            if heartbeat is not None:
                heartbeat()
        return self.passed
