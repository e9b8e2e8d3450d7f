"""What every stage of the Evaluator shares (`StageContext`): the artifact store, the settings resolved for
the device, the scheduler's parts, the timeouts and the worker's secrets, with the small look-ups each
stage makes (the problem, its shape, the candidate's source, a log into the store, its cases, the static
rules, the timing plan)."""

from __future__ import annotations

import hashlib
import random
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gpu_worker import protocol as msg
from gpu_worker.sandbox import Rejection
from gpu_worker.settings import GpuWorkerSettings
from gpu_worker.timing_inputs import pool_cases
from rules.check import check_source
from workflows.artifacts import ArtifactStore

#: a candidate's verification inputs: this many seeds of the settings' seed pool, chosen by its id, so that
#: inputs differ between candidates while the oracle cache still hits
N_SEEDS = 3
LOG_LIMIT = 12000


def default_timeouts(cuda: bool, given: dict | None = None) -> dict:
    """Each stage's command timeouts in seconds; the interpreter's three times the device's."""
    scale = 1.0 if cuda else 3.0
    return {"load": 120 * scale, "compile": 300 * scale, "verify": 300 * scale, "time": 300 * scale,
            "reference": 600 * scale, "profile": 300 * scale, **(given or {})}


class RulesPassed:
    """The sources that passed the static rules on this worker, by the hash of their text and their
    problem: a candidate's source is checked at its first stage and carried through the others. The rules
    are the code this process loaded, so a pass cannot go stale; a refusal is not kept (it raises each
    time, with its reason)."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._passed: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, source: str, problem: str) -> None:
        key = (hashlib.sha256(source.encode()).hexdigest(), problem)
        with self._lock:
            if key in self._passed:
                self._passed.move_to_end(key)
                return
        rep = check_source(source, problem)
        if not rep.ok:
            raise Rejection("rules", f"{rep.rule}: {rep.detail}")
        with self._lock:
            self._passed[key] = None
            while len(self._passed) > self.limit:
                self._passed.popitem(last=False)


@dataclass
class StageContext:
    """The inputs every stage is built with. `cuda` and `interpreter` are set apart (not derived) so that a
    test may give a CPU evaluator the device owner's turns. `sched`: the scheduler whose `owner` and
    `loaded` these are (harness.serial.SerialScheduler or scheduling.Scheduler)."""

    store: ArtifactStore
    settings: GpuWorkerSettings
    cuda: bool
    interpreter: bool
    sched: Any
    owner: Any  # when this worker's work goes on the device (device.owner.DeviceOwner or harness.serial.NoOwner)
    loaded: Any  # a candidate's child goes on from compile to verify to benchmark (scheduling.LoadedChildren)
    timeouts: dict
    static_rules: bool = True  # False only in tests of the run-time guard
    # the timing values' seeds: drawn when the worker starts, from a space too large to precompute
    timing_seed: int = field(default_factory=lambda: 1 << 20 | secrets.randbits(40))
    # random shapes and their seeds, the ncu proof's draw: nothing the candidate can replay
    secret: random.SystemRandom = field(default_factory=random.SystemRandom)
    rules_passed: RulesPassed = field(default_factory=RulesPassed)

    def problem(self, name: str):
        from baselines.registry import get_problem

        return get_problem(name)

    def shape(self, problem, shape_name):
        if shape_name is None:
            return problem.shapes[0] if self.cuda else problem.cpu_shape
        found = problem.shape_named(shape_name)
        if found is not None:
            return found
        raise Rejection("verify", f"problem {problem.name} has no shape {shape_name!r}; shapes: "
                        + ", ".join(s.name for s in list(problem.shapes) + [problem.cpu_shape]))

    @staticmethod
    def child_key(problem: str, shape, source_key: str) -> tuple:
        # the artifact store is content-addressed: one key, one source, so a kept child can only ever be
        # handed the candidate it holds
        if not source_key:
            raise ValueError("a loaded child is keyed by its candidate's source key")
        return (problem, shape.name, source_key)

    def source(self, key: str) -> str:
        return self.store.get_text(key)  # ArtifactStoreError propagates: infrastructure

    def log(self, text: str) -> str | None:
        if not text:
            return None
        if len(text) > LOG_LIMIT:
            text = text[:2000] + "\n...[trimmed]...\n" + text[-(LOG_LIMIT - 2000):]
        return self.store.put_text(text)  # ArtifactStoreError propagates: infrastructure

    def cases(self, problem, candidate_id: str) -> list[tuple[str, int]]:
        rng = random.Random(candidate_id)
        seeds = sorted(rng.sample(range(self.settings.seed_pool), N_SEEDS))
        return [(d, s) for s in seeds for d in problem.distributions]

    def rules(self, source: str, problem: str) -> None:
        if self.static_rules:
            self.rules_passed.check(source, problem)

    def checked(self, req, source: str) -> tuple:
        """A stage's request as (problem, shape), its candidate's source past the static rules; an unknown
        shape or a broken rule raises its Rejection."""
        problem = self.problem(req.problem)
        shape = self.shape(problem, req.shape)
        self.rules(source, req.problem)
        return problem, shape

    def plan(self) -> dict:
        """A benchmark's blocks, repetitions and timing sets per distribution."""
        if self.cuda:
            return {"blocks": self.settings.bench_blocks, "reps": self.settings.bench_reps, "warmup": 3,
                    "rotate": 2, "pool": 3, "host_reps": 5}
        # Interpreter: a cold first baseline call (thread pools, caches) would otherwise inflate the
        # baseline's figures; two warm-up calls cost ~0.2 s per evaluation.
        return {"blocks": 2, "reps": 3, "warmup": 2, "rotate": 2, "pool": 2, "host_reps": 1}

    def timing_pools(self, problem) -> list[tuple[str, int]]:
        """Every distribution's timing-set pool cases (the seeds `timing_set_request` makes its sets from)."""
        return [c for d in problem.distributions for c in pool_cases(d, self.timing_seed, self.plan()["pool"])]

    def timing_set_staging(self, dist: str) -> msg.StageTiming:
        """The host work before `timing_set_request`'s job: the set's pool drawn (or read) ahead."""
        plan = self.plan()
        return msg.StageTiming(dist=dist, rotate=plan["rotate"], seed=self.timing_seed, pool=plan["pool"])

    def timing_set_request(self, dist: str, capture: bool = False) -> msg.Prepare:
        """What every side gets to prepare one distribution's timing set: the same seeds, so that the
        reference child holds the values each timed repetition of a candidate ran on; with `capture`, its
        graphs captured in the same job."""
        plan = self.plan()
        return msg.Prepare(rotate=plan["rotate"], pool=plan["pool"], dist=dist, seed=self.timing_seed,
                           capture=capture)
