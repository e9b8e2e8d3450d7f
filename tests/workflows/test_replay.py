"""Saved histories must replay against today's workflow code: a change that breaks determinism fails
here. tests/histories holds the supported version's histories (docs/architecture.md, Versioning): a run
that continued as new with evaluations under way, the run that completed, one evaluation's child workflow.
Workflow changes that alter the command sequence of a supported version go behind `workflow.patched`."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from activities.worker import WORKFLOWS
from tests.workflows.reordered import ReorderedLoop
from workflows.evaluation import EvaluateCandidate

HISTORIES = sorted((Path(__file__).resolve().parent.parent / "histories").glob("*.json"))
RUNS = [p for p in HISTORIES if "_run" in p.name]


def _load(p: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json("replay-fixture", p.read_text())


def _events(p: Path) -> list[dict]:
    return json.loads(p.read_text())["events"]


def test_fixtures_exist():
    assert len(RUNS) >= 2, "tests/histories holds a continued-as-new run and a completed one"
    assert any("evaluation" in p.name for p in HISTORIES), "and one evaluation's child workflow"


def test_a_fixture_carries_evaluations_across_continue_as_new():
    # an evaluation whose child was started in one run delivers its result to the next: the order of child
    # starts and result signals around continue-as-new is what replays here
    started, delivered = {}, {}
    for p in RUNS:
        for e in _events(p):
            if a := e.get("startChildWorkflowExecutionInitiatedEventAttributes"):
                started[a["workflowId"]] = p.name
            if (a := e.get("workflowExecutionSignaledEventAttributes")) and a["signalName"] == "evaluated":
                res = json.loads(base64.b64decode(a["input"]["payloads"][0]["data"]))
                delivered[res["workflow_id"]] = p.name
    assert started and set(started) == set(delivered)
    assert any(started[w] != delivered[w] for w in started)


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.name)
async def test_history_replays(path):
    await Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter).replay_workflow(_load(path))


async def test_a_nondeterministic_change_is_caught():
    result = await Replayer(workflows=[ReorderedLoop, EvaluateCandidate],
                            data_converter=pydantic_data_converter).replay_workflow(
        _load(RUNS[0]), raise_on_replay_failure=False)
    assert result.replay_failure is not None
