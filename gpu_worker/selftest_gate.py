"""The start-up self-test's verdict, awaited by whatever times: the worker serves compiles and verifications
while the canaries (gpu_worker.canaries) run beside them, and no timed figure is produced before they pass."""

from __future__ import annotations

import threading
import time
from typing import Callable


class SelfTestGate:
    """Pending until `settle` gives it the self-test's result (run_canaries' dict: ok, problems)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: dict = {}

    def settle(self, result: dict) -> None:
        self._result = result
        self._done.set()

    @property
    def settled(self) -> bool:
        return self._done.is_set()

    @property
    def passed(self) -> bool:
        return self._done.is_set() and bool(self._result.get("ok"))

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
