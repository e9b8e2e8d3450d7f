"""Losers cheap, winners thorough: a would-be best's own checks (here the verification at a random shape)
run only for the candidates the run crowns. Siblings of one population that each beat the best they were
started with, and are then demoted by an earlier sibling's crowning, are recorded as passed, unchecked.
Real workflow and dev server, synthetic GPU activities."""

from __future__ import annotations

import asyncio
import json

from activities.ledger import read_ledger
from tests import evaluators
from tests.workflows.helpers import assert_contiguous, start, workers
from workflows import decisions
from workflows.contracts import BenchReport, BenchRequest, EvalRequest, RunSpec, VerifyReport

CHECKED: list[int] = []  # iterations verified at a random shape


def verify(req: EvalRequest) -> VerifyReport:
    if req.random_shape:
        CHECKED.append(req.iteration)
    return evaluators.verify_candidate(req)


async def test_only_crowned_candidates_pay_for_the_best_only_checks(env, store):
    from temporalio import activity

    CHECKED.clear()
    evaluators.REQUESTS.clear()
    gpu = [evaluators.compile_candidate, activity.defn(name="verify_candidate")(verify),
           evaluators.benchmark_candidate, evaluators.profile_candidate]
    spec = RunSpec(problem="softmax", budget={"iterations": 12}, population=4)
    async with workers(env.client, gpu_activities=gpu):
        res = await asyncio.wait_for((await start(env.client, spec, "crown-once")).result(), 120)
    assert_contiguous(store, res, 12)
    recs = read_ledger(store, res.ledger_key)
    crowned = sorted(r.iteration for r in recs if r.outcome == "improved")
    # which benchmarks beat the best they were measured against (each of those paid the checks before)
    would_be = set()
    for name, _, body in evaluators.REQUESTS:
        if name == "benchmark_candidate":
            req = BenchRequest.model_validate(json.loads(body))
            rep = evaluators.benchmark_candidate(req)
            if rep.ok and decisions.improves_on(BenchReport.model_validate(rep), req.best):
                would_be.add(req.iteration)
    passed = {r.iteration for r in recs if r.outcome != "rejected"}
    assert crowned and sorted(CHECKED) == crowned, (CHECKED, crowned)
    assert len(would_be & passed) > len(crowned), (would_be, crowned)  # some were demoted, unchecked
    assert res.best.iteration == crowned[-1]
