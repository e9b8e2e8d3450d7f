"""A run's limits, a change to them, and what the run has used."""

from __future__ import annotations

from pydantic import field_validator, model_validator

from workflows.contracts.base import Strict

BUDGET_FIELDS = ("iterations", "hours", "tokens", "gpu_seconds")


def _positive(v, info):
    if v is not None and not v > 0:
        raise ValueError(f"budget {info.field_name} must be positive, got {v}")
    return v


class Budget(Strict):
    """Limits of a run; None means unlimited. The workflow checks them between steps."""

    iterations: int | None = 30
    hours: float | None = None
    tokens: int | None = None
    gpu_seconds: float | None = None

    _positive = field_validator(*BUDGET_FIELDS)(_positive)


class BudgetChange(Strict):
    """Argument of the `set_budget` update: only the fields given change."""

    iterations: int | None = None
    hours: float | None = None
    tokens: int | None = None
    gpu_seconds: float | None = None

    _positive = field_validator(*BUDGET_FIELDS)(_positive)

    @model_validator(mode="after")
    def _something(self):
        if not self.model_fields_set:
            raise ValueError("set_budget needs at least one of iterations, hours, tokens, gpu_seconds")
        return self


class Used(Strict):
    iterations: int = 0
    seconds: float = 0.0  # wall-clock since the first run started, paused time excluded
    paused_seconds: float = 0.0  # wall-clock spent paused (it does not count against the hours budget)
    tokens_in: int = 0
    tokens_out: int = 0
    gpu_seconds: float = 0.0
    cost_usd: float = 0.0
    turns: int = 0  # llm policy: model turns
    tool_calls: int = 0  # llm policy: tool calls the model made (each one activity)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out
