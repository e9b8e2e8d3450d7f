"""A would-be best is verified again, with a random shape drawn by the harness, at one more of the problem's
shapes (the first the harness lists, the cheapest) or, where it lists none (the interpreter), at its own: a
kernel correct only at the shape it was verified at is rejected as shape-specific, and an honest one is
crowned. Real workflow and dev server; the GPU activities are synthetic ones that report other shapes, as
the harness does on CUDA, or none."""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities.ledger import read_ledger
from gpu_worker.harness.cases import other_shapes
from baselines.registry import get_problem
from tests import evaluators
from tests.workflows.helpers import start, workers
from workflows.contracts import EvalRequest, RunSpec, VerifyReport

SEEN: list[tuple[str | None, bool]] = []


@activity.defn(name="verify_candidate")
def verify_with_other_shapes(req: EvalRequest) -> VerifyReport:
    SEEN.append((req.shape, req.random_shape))
    if req.shape == "B8" and req.iteration == 1:  # the first kernel is right only where it was verified
        return VerifyReport(ok=False, reason="wrong: rel err 0.2 > threshold 1e-5", rel_err=0.2)
    return VerifyReport(ok=True, rel_err=1e-7, threshold=1e-5, other_shapes=[] if req.shape else ["B8", "B64"])


async def two_iterations(env, store, verify, name: str):
    """A two-iteration softmax run with `verify` as the GPU worker's verification: its two records."""
    SEEN.clear()
    gpu = [evaluators.compile_candidate, verify, evaluators.benchmark_candidate, evaluators.profile_candidate]
    async with workers(env.client, gpu_activities=gpu):
        h = await start(env.client, RunSpec(problem="softmax", budget={"iterations": 2}, population=1), name)
        res = await asyncio.wait_for(h.result(), 60)
    first, second = read_ledger(store, res.ledger_key)
    assert second.outcome == "improved" and res.best.iteration == 2, second
    return first, second


async def test_a_would_be_best_is_verified_at_another_shape(env, store):
    first, _ = await two_iterations(env, store, verify_with_other_shapes, "second-shape")
    assert first.outcome == "rejected" and first.family == "shape-specific", first
    assert "not at B8" in first.reason
    assert SEEN == [(None, False), ("B8", True), (None, False), ("B8", True)]


@activity.defn(name="verify_candidate")
def verify_with_no_other_shape(req: EvalRequest) -> VerifyReport:
    SEEN.append((req.shape, req.random_shape))
    if req.random_shape and req.iteration == 1:  # the first kernel is right only at the listed shape
        return VerifyReport(ok=False, reason="shape-specific: correct at M16 N300, not at random M=7 N=5: wrong")
    return VerifyReport(ok=True, rel_err=1e-7, threshold=1e-5, random_shape="random M=1 N=5" if req.random_shape else None)


async def test_where_no_other_shape_is_listed_a_would_be_best_is_verified_at_a_random_one(env, store):
    first, _ = await two_iterations(env, store, verify_with_no_other_shape, "random-shape")
    assert first.outcome == "rejected" and first.family == "shape-specific", first
    assert first.reason.startswith("shape-specific: correct at M16 N300, not at random M=7 N=5"), first.reason
    assert SEEN == [(None, False), (None, True), (None, False), (None, True)]


def test_the_other_shapes_are_listed_cheapest_first():
    kda = get_problem("kda")
    listed = other_shapes(kda, kda.shapes[0])
    assert kda.shapes[0].name not in listed and len(listed) == len(kda.shapes) - 1
    assert listed[0] == "B4 T4096 H16 D128" and listed[-1] == "B1 T32768 H32 D128"
