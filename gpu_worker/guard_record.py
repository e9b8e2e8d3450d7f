"""What the run-time guard refused: the process's one list of refusals and the error raised for each, shared
by the guard's parts (gpu_worker.guard and gpu_worker.guard_torch) without either importing the other."""

from __future__ import annotations

VIOLATIONS: list[tuple[str, str]] = []


class GuardViolation(RuntimeError):
    def __init__(self, rule: str, detail: str):
        super().__init__(f"[{rule}] {detail}")
        self.rule = rule
