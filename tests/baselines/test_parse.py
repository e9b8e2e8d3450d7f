"""Parsing survives a collection that runs a finalizer formatting a traceback (which parses source itself)."""

from __future__ import annotations

import gc
import traceback
from pathlib import Path

from baselines.parse import parse

REPO = Path(__file__).resolve().parents[2]


class _FormatsATracebackWhenCollected:
    """Garbage that leaves garbage like itself behind while `alive`: some collection always finds one."""
    alive = True
    formatted = 0

    def __init__(self) -> None:
        self.cycle = self  # only the collector frees it

    def __del__(self) -> None:
        try:
            {}["key"] + [0][0]
        except KeyError as e:
            "".join(traceback.format_exception(e))  # the carets under the line come from ast.parse
            type(self).formatted += 1
        if type(self).alive:
            type(self)()


def test_a_finalizer_run_by_a_collection_does_not_break_the_parse():
    source = (REPO / "workflows" / "optimization.py").read_text()
    thresholds = gc.get_threshold()
    gc.set_threshold(1)  # a collection at nearly every allocation, inside the conversion too
    try:
        _FormatsATracebackWhenCollected()
        for _ in range(5):
            assert parse(source).body
    finally:
        _FormatsATracebackWhenCollected.alive = False
        gc.set_threshold(*thresholds)
        gc.collect()
    assert _FormatsATracebackWhenCollected.formatted > 5  # the finalizers ran between the parses
    assert gc.isenabled()
