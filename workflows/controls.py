"""What a run's operator controls accept, as plain functions of the run's state and the control's raw input.

The plain temporal CLI sends any JSON with a signal (`temporal workflow signal --name set_budget --input ...`),
and a signal has no answer: the run validates it here, and a refusal, one line saying why, is kept in the
run's status and details (`Refused`, `note_refusal`) instead of being dropped.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from workflows import decisions
from workflows.contracts import Budget, BudgetChange, Hint, StopRequest, Used, explain

#: the signals a run takes; any other name is refused by name
SIGNALS = ("stop", "pause", "resume", "hint", "clear_hints", "set_budget")
#: how many refusals a run keeps (the newest), in its status and its details
REFUSALS_KEPT = 5


class Refused(ValueError):
    """A control the run does not apply, with the reason in one line."""


def budget_after(budget: Budget, used: Used, change: Any, finished: bool) -> Budget:
    """The budget after `change` (only the fields it names), or Refused: the run has finished, the change
    is not a BudgetChange, or it is below what is used."""
    if finished:
        raise Refused("the run has finished")
    if not isinstance(change, dict):
        raise Refused(f'invalid budget change: expected {{"iterations": N, ...}}, got {_shown(change)}')
    try:
        parsed = BudgetChange.model_validate(change)
    except ValidationError as e:
        raise Refused(f"invalid budget change: {explain(e)}") from None
    try:
        decisions.check_budget_change(budget, parsed, used)
    except ValueError as e:
        raise Refused(str(e)) from None
    return decisions.apply_budget_change(budget, parsed)


def context_tokens(tokens: Any, finished: bool) -> int:
    """The llm policy's prompt cap after `set_context_tokens`, or Refused: a whole number of at least 2000."""
    if finished:
        raise Refused("the run has finished")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 2000:
        raise Refused(f"context_tokens must be a whole number of at least 2000, got {tokens!r}")
    return tokens


def hint_text(raw: Any) -> str:
    """A hint's text from `{"text": "..."}`, or Refused."""
    if not isinstance(raw, dict):
        raise Refused(f'invalid hint: expected {{"text": "..."}}, got {_shown(raw)}')
    try:
        return Hint.model_validate(raw).text
    except ValidationError as e:
        raise Refused(f'invalid hint: {explain(e)} (expected {{"text": "..."}})') from None


def stop_request(raw: Any) -> StopRequest:
    """A stop from `{"reason": "...", "now": true}` (either field may be left out: `reason` defaults to
    "operator", `now` to false), or from nothing at all, or Refused."""
    if raw is not None and not isinstance(raw, dict):
        raise Refused(f'invalid stop: expected {{"reason": "...", "now": true|false}} or no input, got {_shown(raw)}')
    try:
        return StopRequest.model_validate({} if raw is None else raw)
    except ValidationError as e:
        raise Refused(f'invalid stop: {explain(e)} (expected {{"reason": "...", "now": true|false}} or no input)'
                      ) from None


def later_stop(current: StopRequest | None, new: StopRequest) -> StopRequest:
    """The stop in force after `new`: its reason, and `now` once any stop asked for it (a stop under way
    that cancels what runs does not go back to waiting for it)."""
    if current is not None and current.now and not new.now:
        return new.model_copy(update={"now": True})
    return new


def unknown_signal(name: str) -> str:
    why = f"this run has no signal {name!r}; its signals: {', '.join(SIGNALS)}"
    if name == "set_context_tokens":
        why += " (set_context_tokens is an update: temporal workflow update execute)"
    return why


def note_refusal(refused: list[str], when: str, name: str, why: str) -> list[str]:
    """The run's refusals with this one added, the newest REFUSALS_KEPT."""
    return (refused + [f"{when} {name}: {why}"])[-REFUSALS_KEPT:]


def _shown(raw: Any) -> str:
    return "no input" if raw is None else repr(raw)[:80]
