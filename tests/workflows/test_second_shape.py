"""A would-be best is verified at one more of the problem's shapes (the first the harness lists, the
cheapest): a kernel correct only at the shape it was verified at is rejected as shape-specific, and an
honest one is crowned. Real workflow and dev server; the GPU activities are synthetic ones that report
other shapes, as the harness does on CUDA."""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities.ledger import read_ledger
from gpu_worker.harness import other_shapes
from baselines.registry import get_problem
from tests import evaluators
from tests.workflows.helpers import start, workers
from workflows.contracts import EvalRequest, RunSpec, VerifyReport

SEEN: list[str | None] = []


@activity.defn(name="verify_candidate")
def verify_with_other_shapes(req: EvalRequest) -> VerifyReport:
    SEEN.append(req.shape)
    if req.shape == "B8" and req.iteration == 1:  # the first kernel is right only where it was verified
        return VerifyReport(ok=False, reason="wrong: rel err 0.2 > threshold 1e-5", rel_err=0.2)
    return VerifyReport(ok=True, rel_err=1e-7, threshold=1e-5, other_shapes=[] if req.shape else ["B8", "B64"])


async def test_a_would_be_best_is_verified_at_another_shape(env, store):
    SEEN.clear()
    gpu = [evaluators.compile_candidate, verify_with_other_shapes, evaluators.benchmark_candidate,
           evaluators.profile_candidate]
    async with workers(env.client, gpu_activities=gpu):
        h = await start(env.client, RunSpec(problem="softmax", budget={"iterations": 2}, population=1),
                        "second-shape")
        res = await asyncio.wait_for(h.result(), 60)
    first, second = read_ledger(store, res.ledger_key)
    assert first.outcome == "rejected" and first.family == "shape-specific", first
    assert "not at B8" in first.reason
    assert second.outcome == "improved" and res.best.iteration == 2, second
    assert SEEN == [None, "B8", None, "B8"]


def test_the_other_shapes_are_listed_cheapest_first():
    kda = get_problem("kda")
    listed = other_shapes(kda, kda.shapes[0])
    assert kda.shapes[0].name not in listed and len(listed) == len(kda.shapes) - 1
    assert listed[0] == "B4 T4096 H16 D128" and listed[-1] == "B1 T32768 H32 D128"
