"""Losers cheap, winners thorough: a would-be best's own checks (the fresh-process re-measure, the second
listed shape, the random shape) run only for the candidates the run crowns, each against the best it
displaces. Siblings of one population that each beat the best they were started with, and are then demoted
by an earlier sibling's crowning, are recorded as passed, unchecked. Real workflow and dev server, synthetic
GPU activities (the second test's report device figures: a head-to-head interval, no interpreter)."""

from __future__ import annotations

import asyncio
import json
import threading

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
        h = await start(env.client, spec, "crown-once")
        res = await asyncio.wait_for(h.result(), 120)
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
    # the crowned candidate's checks go first on its worker's queue (the run records nothing after it until
    # they end); its stages before the crowning wait their turn
    from temporalio.api.enums.v1 import EventType

    (child,) = [w async for w in env.client.list_workflows(f'WorkflowId STARTS_WITH "{h.id}-eval-{crowned[-1]}-"')]
    keys, crowned_yet = [], False
    async for e in env.client.get_workflow_handle(child.id).fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            crowned_yet = crowned_yet or e.workflow_execution_signaled_event_attributes.signal_name == "crown"
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            keys.append((a.activity_type.name, crowned_yet, a.priority.priority_key))
    # compile, verify, benchmark: the default, or 2 once it was the run's oldest unrecorded iteration (`front`)
    assert len([k for _, after, k in keys if not after]) == 3 and all(k in (0, 2) for _, after, k in keys
                                                                       if not after), keys
    assert [k for _, after, k in keys if after] and all(k == 1 for _, after, k in keys if after), keys


FRESH: list[tuple[int, str]] = []  # (iteration, the best it was re-measured against) of fresh re-measures
SHAPES: list[tuple[int, str | None, bool]] = []  # (iteration, shape, random_shape) of every verification


def device_verify(req: EvalRequest) -> VerifyReport:
    SHAPES.append((req.iteration, req.shape, req.random_shape))
    rep = evaluators.verify_candidate(req)
    return rep.model_copy(update={"interpreter": False, "other_shapes": [] if req.shape else ["B8"]})


def device_bench(req: BenchRequest) -> BenchReport:
    """The synthetic figures as a device would report them: a head-to-head interval against the best."""
    if req.fresh_process:
        FRESH.append((req.iteration, req.best.candidate_id))
    rep = evaluators.benchmark_candidate(req)
    upd = {"interpreter": False}
    if req.best is not None:
        r = req.best.time_ms / rep.time_ms
        upd.update(vs_best=req.best.candidate_id, vs_best_ci=(r * 0.99, r * 1.01), best_time_ms=req.best.time_ms)
    return rep.model_copy(update=upd)


async def _device_run(client, store, verify_fn, bench_fn, population: int, prefix: str) -> list:
    """A 12-iteration run whose verifications and benchmarks are `verify_fn` and `bench_fn`: its ledger."""
    from temporalio import activity

    FRESH.clear()
    SHAPES.clear()
    gpu = [evaluators.compile_candidate, activity.defn(name="verify_candidate")(verify_fn),
           activity.defn(name="benchmark_candidate")(bench_fn), evaluators.profile_candidate]
    spec = RunSpec(problem="softmax", budget={"iterations": 12}, population=population)
    async with workers(client, gpu_activities=gpu):
        res = await asyncio.wait_for((await start(client, spec, prefix)).result(), 120)
    return read_ledger(store, res.ledger_key)


async def test_a_crowned_candidate_gets_every_check_against_the_best_it_displaces(env, store):
    recs = await _device_run(env.client, store, device_verify, device_bench, 4, "crown-checks")
    crowned = [r for r in recs if r.outcome == "improved"]
    assert len(crowned) >= 2, [(r.iteration, r.outcome) for r in recs]
    # the first best has nothing to be re-measured against; every later one against the best it displaced
    assert FRESH == [(r.iteration, prev.candidate_id) for prev, r in zip(crowned, crowned[1:])], FRESH
    assert all(r.vs_best == prev.candidate_id for prev, r in zip(crowned, crowned[1:]))
    # every crowned candidate verified at the second listed shape (with a random one), and no other
    again = sorted(i for i, shape, rnd in SHAPES if shape == "B8" and rnd)
    assert again == [r.iteration for r in crowned], (again, SHAPES)


TOGETHER: dict = {}  # iteration -> its checks' events: "verify" and "fresh" begun, and what the re-measure saw
_lock = threading.Lock()
_unconfirmed: list[int] = []  # the first candidate re-measured: its re-measure does not confirm it


def _event(iteration: int, name: str) -> threading.Event:
    with _lock:
        return TOGETHER.setdefault(iteration, {"verify": threading.Event(), "fresh": threading.Event()})[name]


def together_verify(req: EvalRequest) -> VerifyReport:
    rep = device_verify(req)
    if req.random_shape:
        _event(req.iteration, "verify").set()
        # the first best has no re-measure (nothing to meet): a short wait tells it apart
        if _event(req.iteration, "fresh").wait(3) and req.iteration == _unconfirmed[0]:
            return rep.model_copy(update={"ok": False, "reason": "wrong: rel err 0.4 at the random shape"})
    return rep


def together_bench(req: BenchRequest) -> BenchReport:
    rep = device_bench(req)
    if req.fresh_process:
        with _lock:
            _unconfirmed.append(req.iteration)
        _event(req.iteration, "fresh").set()
        # the re-measure ends only once its candidate's verification at the other shapes has begun
        TOGETHER[req.iteration]["seen"] = _event(req.iteration, "verify").wait(30)
        if req.iteration == _unconfirmed[0]:  # slower than the best this time: not believed
            rep = rep.model_copy(update={"time_ms": req.best.time_ms * 2, "vs_best_ci": (0.49, 0.51)})
    return rep


async def test_a_crowned_candidates_re_measure_and_other_shapes_run_at_once(env, store):
    """Under the patch: the fresh re-measure and the verification at other shapes of a crowned candidate
    overlap (the re-measure waits for the verification to begin); a candidate whose re-measure does not
    confirm it is recorded as passed, its failed shape check unused, as it was when the check came after."""
    TOGETHER.clear()
    _unconfirmed.clear()
    recs = {r.iteration: r for r in await _device_run(env.client, store, together_verify, together_bench, 2,
                                                      "crown-together")}
    re_measured = [i for i, _ in FRESH]
    assert len(re_measured) >= 2, [(r.iteration, r.outcome) for r in recs.values()]
    assert all(TOGETHER[i].get("seen") for i in re_measured), TOGETHER
    first = _unconfirmed[0]
    assert recs[first].outcome == "passed" and not recs[first].reason, recs[first]
    assert all(recs[i].outcome == "improved" for i in re_measured if i != first)
