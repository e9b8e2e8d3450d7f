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


def test_an_llm_policy_fixture_carries_its_patches():
    # the llm policy's own commands replay too: model turns and tools as local activities, its patches
    # decided at the start, a repeated failing call answered without running, continue-as-new
    runs = [p for p in RUNS if p.name.startswith("llm_")]
    assert len(runs) >= 2, "tests/histories holds an llm-policy run that continued as new"
    first = json.dumps(_events(runs[0]))
    assert base64.b64encode(b'"llm-patches-at-start"').decode()[:20] in first
    turns = [e for p in runs for e in _events(p) if (a := e.get("activityTaskScheduledEventAttributes"))
             and a["activityType"]["name"] == "llm_turn"]
    assert len(turns) >= 10
    texts = [base64.b64decode(d).decode(errors="replace") for d in _payload_data(json.loads(first))]
    assert any("times in a row" in t for t in texts)


def test_a_fixture_holds_a_new_bests_checks_at_once():
    # best-checks-together: the re-measure and the verification at other shapes scheduled by one workflow
    # task, after the benchmark's
    best = [p for p in HISTORIES if p.name.startswith("together_") and "evaluation" in p.name]
    assert best, "tests/histories holds a new best's evaluation recorded under best-checks-together"
    tasks, n = [], 0
    for e in _events(best[0]):
        if e.get("workflowTaskCompletedEventAttributes") is not None:
            n += 1
        if a := e.get("activityTaskScheduledEventAttributes"):
            tasks.append((a["activityType"]["name"], n))
    names = [t[0] for t in tasks]
    assert names[-3:] == ["benchmark_candidate", "benchmark_candidate", "verify_candidate"], names
    assert tasks[-2][1] == tasks[-1][1] > tasks[-3][1], tasks


def test_a_fixture_tells_an_evaluation_under_way_it_is_the_front():
    # front-iteration-first: the run signals `front` to the oldest unrecorded evaluation still under way, and
    # that evaluation's stages scheduled after the signal carry priority 2
    sent = [a for p in RUNS if p.name.startswith("front_") for e in _events(p)
            if (a := e.get("signalExternalWorkflowExecutionInitiatedEventAttributes")) and a["signalName"] == "front"]
    assert sent, "tests/histories holds a run that told an evaluation it is the front"
    (told,) = [p for p in HISTORIES if p.name.endswith("_evaluation_front.json")]
    keys, seen = [], False
    for e in _events(told):
        if (a := e.get("workflowExecutionSignaledEventAttributes")) and a["signalName"] == "front":
            seen = True
        if a := e.get("activityTaskScheduledEventAttributes"):
            keys.append((seen, a.get("priority", {}).get("priorityKey", 0)))
    assert seen and any(after for after, _ in keys), keys
    assert all(k == 2 for after, k in keys if after), keys
    # the run's own GPU activities (an llm policy's compile and profile tools) wait at the front's priority too
    tools = [a for p in RUNS if p.name.startswith("front_llm_") for e in _events(p)
             if (a := e.get("activityTaskScheduledEventAttributes")) and a["taskQueue"]["name"] == "marathon-gpu"]
    assert tools and all(a.get("priority", {}).get("priorityKey") == 2 for a in tools), tools


def _payload_data(x):
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "data" and isinstance(v, str):
                yield v
            else:
                yield from _payload_data(v)
    elif isinstance(x, list):
        for v in x:
            yield from _payload_data(v)


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.name)
async def test_history_replays(path):
    await Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter).replay_workflow(_load(path))


async def test_a_nondeterministic_change_is_caught():
    result = await Replayer(workflows=[ReorderedLoop, EvaluateCandidate],
                            data_converter=pydantic_data_converter).replay_workflow(
        _load(RUNS[0]), raise_on_replay_failure=False)
    assert result.replay_failure is not None
