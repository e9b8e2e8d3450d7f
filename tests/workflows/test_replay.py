"""Saved histories must replay against today's workflow code: a change that breaks determinism fails
here. Workflow changes that alter the command sequence go behind `workflow.patched`."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.workflows.reordered import ReorderedLoop
from workflows.optimization import KernelOptimization

HISTORIES = sorted((Path(__file__).resolve().parent.parent / "histories").glob("*.json"))


def _load(p: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json("replay-fixture", p.read_text())


def test_fixtures_exist():
    assert len(HISTORIES) >= 2, "tests/histories holds a continued-as-new run and a completed one"


def test_a_fixture_exercises_the_rolling_population():
    # v3_ histories were recorded with the rolling population (patch "rolling-population") and a slow
    # candidate every third iteration, so its interleaved activity order is what replays here
    import base64
    import json

    patches = set()
    for p in HISTORIES:
        for e in json.loads(p.read_text())["events"]:
            m = e.get("markerRecordedEventAttributes")
            if m and m.get("markerName") == "core_patch":
                patches.add(json.loads(base64.b64decode(m["details"]["patch-data"]["payloads"][0]["data"]))["id"])
    assert {"check-spec", "rolling-population"} <= patches


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.name)
async def test_history_replays(path):
    await Replayer(workflows=[KernelOptimization], data_converter=pydantic_data_converter).replay_workflow(
        _load(path))


async def test_a_nondeterministic_change_is_caught():
    result = await Replayer(workflows=[ReorderedLoop], data_converter=pydantic_data_converter).replay_workflow(
        _load(HISTORIES[0]), raise_on_replay_failure=False)
    assert result.replay_failure is not None
