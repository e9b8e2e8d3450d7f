"""The GPU worker's self-test verdict, held by its Evaluator (`Evaluator.selftest_verdict`, settled by
Evaluator.selftest) and read by the activities: after a failed verdict the worker refuses all work, and
while a start-up self-test is still running its timed work waits here for the verdict. A passing verdict is
kept on disk (`SelfTestRecord`), keyed by what decides it, for the worker's next start."""

from __future__ import annotations

import threading
import time
from pathlib import Path
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


#: a kept verdict older than this is stale: the canaries run again
MAX_AGE_S = 7 * 24 * 3600
#: settings that change nothing the canaries judge: where files go, what is warmed
_NOT_JUDGING = {"gpu_workdir", "cache_dir", "warm_problem", "warm_shape", "warm_all_shapes", "gpu_selftest",
                "oracle_disk_gb"}


def selftest_key(settings, cuda: bool) -> dict | None:
    """What decides a self-test's verdict: the harness's code (gpu_worker, the canaries, rules, the softmax
    problem they run), the settings that judge, torch/Triton/FLA, the GPU model and its driver, the host.
    None where one cannot be told (then the canaries always run)."""
    from gpu_worker.caches import code_tag, gpu_model, host_key, versions

    root = Path(__file__).resolve().parent.parent
    files = (sorted((root / "gpu_worker").rglob("*.py")) + sorted((root / "rules").rglob("*.py"))
             + sorted((root / "baselines" / "softmax").glob("*.py"))
             + [root / "baselines" / "problem.py", root / "baselines" / "perturb.py"])
    code, model = code_tag(files), gpu_model(cuda)
    if code is None or model is None:
        return None
    judging = {k: v for k, v in settings.model_dump(mode="json").items() if k not in _NOT_JUDGING}
    return {"kind": "selftest", "code": code, "settings": judging, "device": model, "cuda": cuda, **host_key(),
            **versions()}


class SelfTestRecord:
    """The last passing self-test of this harness on this host and GPU model, kept on disk (the caches'
    `selftest` folder): a restarted worker settles its verdict from it instead of waiting for the canaries
    (30-230 s on an H200 beside other work). Only a pass is kept; a failure is never reused, so a worker
    that failed tries again at its next start. A record older than MAX_AGE_S is stale."""

    def __init__(self, settings, cuda: bool, max_age_s: float = MAX_AGE_S):
        from gpu_worker.caches import DiskCache, cache_root

        self.key = selftest_key(settings, cuda)
        self.disk = DiskCache(cache_root(settings), "selftest")
        self.max_age_s = max_age_s

    def load(self) -> dict | None:
        """The kept passing result, with `reused_from` (when it was run), or None."""
        if self.key is None:
            return None
        found = self.disk.get_json(self.key)
        if not isinstance(found, dict) or not isinstance(found.get("result"), dict):
            return None
        at = found.get("at")
        if not isinstance(at, (int, float)) or not 0 <= time.time() - at <= self.max_age_s:
            return None
        result = found["result"]
        if not result.get("ok"):
            return None
        return {**result, "reused_from": at}

    def store(self, result: dict) -> None:
        if self.key is not None and result.get("ok"):
            self.disk.put_json(self.key, {"at": time.time(), "result": result})
