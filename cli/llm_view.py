"""How an llm run's turns and its endpoint's trouble read in `status` and `watch`: each turn as it
happens (the tools called, their verdicts, the tokens), and an endpoint that keeps failing (from the
workflow's pending `llm_turn` activity: its attempt and last failure)."""

from __future__ import annotations

from datetime import datetime, timezone

from workflows.contracts import TurnView
from workflows.text import clip


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%H:%M:%S UTC")


def turn_line(v: TurnView, paused: bool = False) -> str:
    """`turn 7: compile, submit_kernel (1,234 in / 56 out tokens)`; a turn still waiting for its reply says so.
    A paused run waits for nobody: its unanswered turn failed (no key, endpoint gone), and the pause says why."""
    only = " [only submit_kernel offered]" if v.submit_only else ""
    if not v.replied:
        if paused:
            return f"turn {v.turn}: asked at {_clock(v.asked_at)}, not answered: the run paused{only}"
        return f"turn {v.turn}: asked at {_clock(v.asked_at)}, waiting for the model{only}"
    what = ", ".join(c.name for c in v.calls) or f"no tool call: {clip(v.note, 100) or 'nothing to run'}"
    return f"turn {v.turn}: {what} ({v.tokens_in:,} in / {v.tokens_out:,} out tokens){only}"


def call_line(name: str, verdict: str, error: bool) -> str:
    return f"  {name}: {'ERROR ' if error else ''}{clip(verdict, 150)}"


def turn_lines(v: TurnView, paused: bool = False) -> list[str]:
    """The turn and each answered call, for `status`."""
    return [turn_line(v, paused)] + [call_line(c.name, c.verdict, c.error) for c in v.calls if c.verdict]


class TurnPrinter:
    """What `watch` has printed of the turns: each turn once its reply is in, each verdict once it comes,
    and a turn still waiting for its reply after `wait_note` seconds (a slow model is not a dead run)."""

    def __init__(self, wait_note: float = 15.0) -> None:
        self.wait_note = wait_note
        self.turns: set[int] = set()
        self.waiting: set[int] = set()
        self.calls: set[tuple[int, int]] = set()

    def new_lines(self, turns: list[TurnView], now: float, paused: bool = False) -> list[str]:
        out = []
        for v in turns:
            if not v.replied:
                # a paused run's unanswered turn is not waited on (the pause line says why); once resumed, it is
                if not paused and now - v.asked_at >= self.wait_note and v.turn not in self.waiting:
                    self.waiting.add(v.turn)
                    out.append(turn_line(v))
                continue
            if v.turn not in self.turns:
                self.turns.add(v.turn)
                out.append(turn_line(v))
            for i, c in enumerate(v.calls):
                if c.verdict and (v.turn, i) not in self.calls:
                    self.calls.add((v.turn, i))
                    out.append(call_line(c.name, c.verdict, c.error))
        return out


def endpoint_trouble(desc, asked_at: float | None = None) -> str | None:
    """A line when the model's endpoint has failed the current turn at least once (a pending `llm_turn`
    activity past its first attempt), else None. `desc`: the workflow's describe()."""
    for p in desc.raw_description.pending_activities:
        if p.activity_type.name != "llm_turn" or p.attempt < 2:
            continue
        failure = (p.last_failure.message or "").splitlines()[0] if p.HasField("last_failure") else ""
        down = any(w in failure for w in ("connection failed", "timed out"))
        since = f" since {_clock(asked_at)}" if asked_at else ""
        at = ""
        if p.HasField("next_attempt_schedule_time") and p.next_attempt_schedule_time.seconds:
            at = f" at {_clock(p.next_attempt_schedule_time.seconds)}"
        failed = p.attempt - 1
        return (f"model endpoint {'unreachable' if down else 'failing'}{since}: {failed} attempt"
                f"{'s' if failed != 1 else ''} failed, the last with: {clip(failure, 200)}; attempt {p.attempt}"
                f"{f' of {p.maximum_attempts}' if p.maximum_attempts else ''}{at}")
    return None
