"""A paused llm run's unanswered turn reads as not answered in `status` and `watch`, never as waiting for the
model: the turn failed (no API key, endpoint gone) and the run paused, with the pause's reason shown beside it."""

from __future__ import annotations

from cli.llm_view import TurnPrinter, turn_lines
from workflows.contracts import TurnView


def test_status_says_a_paused_run_s_turn_was_not_answered():
    asked = TurnView(turn=1, asked_at=1000.0)
    (line,) = turn_lines(asked, paused=True)
    assert line.startswith("turn 1: asked at ") and line.endswith("not answered: the run paused"), line
    assert "waiting for the model" not in line
    (line,) = turn_lines(asked)  # a running run's unanswered turn is still waiting
    assert line.endswith("waiting for the model"), line


def test_watch_prints_no_waiting_line_while_the_run_is_paused_and_one_once_it_resumes():
    p = TurnPrinter(wait_note=15)
    asked = TurnView(turn=1, asked_at=1000.0)
    assert p.new_lines([asked], now=1020.0, paused=True) == []
    (waiting,) = p.new_lines([asked], now=1030.0)
    assert waiting.endswith("waiting for the model"), waiting
