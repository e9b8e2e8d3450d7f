"""`marathon status`'s first line: a paused run says why it pauses; a run stopped while paused is done, and no
longer reads as paused."""

from __future__ import annotations

from types import SimpleNamespace

from cli.query import headline


def status(phase: str, paused: bool) -> SimpleNamespace:
    return SimpleNamespace(workflow_id="r8", problem="softmax", policy="llm", iteration=0, phase=phase,
                           paused=paused, pause_reason="llm_turn failed: no key", runs=1)


def test_a_paused_run_says_why_and_a_run_stopped_while_paused_does_not():
    assert headline(status("proposing", True)) == ("r8: softmax (llm) iteration 0, phase proposing "
                                                   "(paused: llm_turn failed: no key), run 1")
    assert headline(status("done", True)) == "r8: softmax (llm) iteration 0, phase done, run 1"
    assert headline(status("proposing", False)) == "r8: softmax (llm) iteration 0, phase proposing, run 1"
