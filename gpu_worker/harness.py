"""The evaluator: compile, verify, benchmark, profile and self-test candidates, independent of Temporal.

Process layout (why the numbers can be trusted):

* this process (the worker) owns statistics, thresholds and decisions; it never loads candidate code;
* one *reference* child per (problem, shape) computes the oracle and the primary baseline's outputs, keeps
  the oracle on its device and compares every candidate output with it there, and times the baseline; it
  is trusted code only;
* every candidate is loaded into a fresh *candidate* child (single use) whose guard was installed before
  the candidate's module executed. Timing inside that child uses event/synchronize/perf_counter objects
  captured before the load and re-checked for identity after every call; a new best is additionally
  re-measured in another fresh child and cross-checked against torch.profiler's kernel time, then proven
  by Nsight Compute's trace of a separate process (harness_ncu_proof).

All rejections are returned as reports; only infrastructure failures (artifact store) raise.
"""

from __future__ import annotations

import collections
import random
import secrets
import threading
import time
from typing import Callable

from gpu_worker import protocol as msg
from gpu_worker.harness_benchmark import BenchmarkStage
from gpu_worker.harness_best_checks import BestOnlyChecks
from gpu_worker.harness_children import EvaluatorChildren, ReferenceOutOfMemory
from gpu_worker.harness_compile import CompileStage, shared_over_limit  # noqa: F401 - re-exported
from gpu_worker.harness_ncu_proof import NcuProofCheck
from gpu_worker.harness_serial import SerialScheduler
from gpu_worker.harness_timed_outputs import TimedOutputChecks, _check_entries  # noqa: F401 - re-exported
from gpu_worker.harness_verify import VerifyStage, other_shapes  # noqa: F401 - re-exported
from gpu_worker.phases import Heartbeat, phases_begin, phases_end  # noqa: F401 - the activities read them here
from gpu_worker.phases import add_phase as _add_phase
from gpu_worker.phases import waiting_heartbeat as _waiting_heartbeat
from rules.check import check_source
from gpu_worker.sandbox import Rejection, Sandbox
from gpu_worker.selftest_verdict import SelfTestVerdict
from gpu_worker.settings import GpuWorkerSettings, cuda_available
from workflows.artifacts import ArtifactStore
from workflows.contracts import EvalRequest, ProfileReport

#: a candidate's verification inputs: this many seeds of the settings' seed pool, chosen by its id, so that
#: inputs differ between candidates while the oracle cache still hits
N_SEEDS = 3
LOG_LIMIT = 12000
#: a reference child asked to exit may first write the cache entries it queued (KDA's are GBs at some shapes)
REFERENCE_GRACE_S = 60.0


class Evaluator(EvaluatorChildren, CompileStage, VerifyStage, BestOnlyChecks, NcuProofCheck, BenchmarkStage,
                TimedOutputChecks):
    """Judges candidates stage by stage; each stage and each family of checks is a base class of its own
    module (harness_compile, harness_verify, harness_benchmark, harness_timed_outputs, harness_best_checks,
    harness_ncu_proof),
    all built on the children and device turns of harness_children.

    `settings`: the worker's (GpuWorkerSettings.from_env at its start); None takes the defaults. They are
    resolved here for this evaluator's device and handed to every child it starts."""

    def __init__(self, store: ArtifactStore | None = None, interpreter: bool | None = None,
                 timeouts: dict | None = None, static_rules: bool = True, scheduler=None,
                 settings: GpuWorkerSettings | None = None):
        self.store = store or ArtifactStore()
        settings = settings or GpuWorkerSettings()
        self.interpreter = (not cuda_available(settings)) if interpreter is None else interpreter
        self.cuda = not self.interpreter
        self.settings = settings.for_device(self.cuda)
        # the device owner, spares, hand-on and pinning (see SerialScheduler): the caller's choice
        self.sched = scheduler if scheduler is not None else SerialScheduler()
        self.owner = self.sched.owner  # when this worker's work goes on the device (device_owner.DeviceOwner)
        self._ceilings_lock = threading.Lock()  # the ceilings are measured once
        # a candidate's child goes on from compile to verify to benchmark (scheduling.LoadedChildren)
        self.loaded = self.sched.loaded
        self._refs: dict[tuple, tuple[Sandbox, threading.Lock, dict]] = {}
        self._refs_lock = threading.Lock()
        # per (problem, shape, dist, seed): the inputs' fingerprint and the baseline's own error. Small and
        # deterministic, so never evicted; the oracle itself lives in the reference child (child_reference).
        self._ref_meta: dict[tuple, dict] = {}
        self._ref_meta_lock = threading.Lock()
        self.ceilings: msg.Ceilings | None = None
        scale = 1.0 if self.cuda else 3.0
        self.timeouts = {"load": 120 * scale, "compile": 300 * scale, "verify": 300 * scale, "time": 300 * scale,
                         "reference": 600 * scale, "profile": 300 * scale, **(timeouts or {})}
        # the one holder of this worker's self-test verdict: the activities refuse work after a failure, and
        # timed work waits on it while a start-up self-test runs (gpu_worker.activities)
        self.selftest_verdict = SelfTestVerdict()
        # the timing values' seeds: drawn when the worker starts, from a space too large to precompute
        self.timing_seed = 1 << 20 | secrets.randbits(40)
        self._secret = random.SystemRandom()  # random shapes and their seeds: nothing the candidate can replay
        self._random_users: collections.Counter = collections.Counter()  # (problem, random shape) -> verifications
        self._prepared_shapes: set[tuple[str, str]] = set()  # (problem, shape) prepared ahead for a best's checks
        self.static_rules = static_rules  # False only in tests of the run-time guard
        # last: a CUDA pool's background thread readies spares through _cuda_init, which needs the above
        self.pool = self.sched.pool(self.interpreter, ready=self._cuda_init if self.cuda else None,
                                    settings=self.settings)

    def close(self):
        self.pool.close()
        self.loaded.close()
        with self._refs_lock:
            for sb, _, _ in self._refs.values():
                sb.close(graceful=True, grace_s=REFERENCE_GRACE_S)
            self._refs.clear()

    # --- helpers ---------------------------------------------------------------------------------
    def _problem(self, name: str):
        from baselines.registry import get_problem

        return get_problem(name)

    def _shape(self, problem, shape_name):
        if shape_name is None:
            return problem.shapes[0] if self.cuda else problem.cpu_shape
        found = problem.shape_named(shape_name)
        if found is not None:
            return found
        raise Rejection("verify", f"problem {problem.name} has no shape {shape_name!r}; shapes: "
                        + ", ".join(s.name for s in list(problem.shapes) + [problem.cpu_shape]))

    @staticmethod
    def _child_key(problem: str, shape, source_key: str) -> tuple:
        # the artifact store is content-addressed: one key, one source, so a kept child can only ever be
        # handed the candidate it holds
        if not source_key:
            raise ValueError("a loaded child is keyed by its candidate's source key")
        return (problem, shape.name, source_key)

    def _source(self, key: str) -> str:
        return self.store.get_text(key)  # ArtifactStoreError propagates: infrastructure

    def _log(self, text: str) -> str | None:
        if not text:
            return None
        if len(text) > LOG_LIMIT:
            text = text[:2000] + "\n...[trimmed]...\n" + text[-(LOG_LIMIT - 2000):]
        return self.store.put_text(text)  # ArtifactStoreError propagates: infrastructure

    def cases(self, problem, candidate_id: str) -> list[tuple[str, int]]:
        rng = random.Random(candidate_id)
        seeds = sorted(rng.sample(range(self.settings.seed_pool), N_SEEDS))
        return [(d, s) for s in seeds for d in problem.distributions]

    def _retried_alone(self, attempt: Callable):
        """A stage that ran out of device memory, or whose child was killed by a SIGKILL the harness did not
        send (most likely the host's OOM killer), is run once more with the device to itself
        (DeviceOwner.alone: no other stage of ours runs meanwhile): beside up to 24 other candidates the memory may have been taken by the
        neighbours, and an innocent candidate must not be scored for it (on the H200 that was 9 of 49 prefill
        evaluations in one run). What fails alone is the candidate's.
        The report says both: the retry's log starts with the first attempt's reason. The trusted reference
        child running out of memory during the stage (ReferenceOutOfMemory) is retried alone the same way."""
        retries = self.cuda and self.owner.retries_alone
        try:
            first = attempt()
        except ReferenceOutOfMemory as e:
            if not retries:
                raise
            first, why = None, str(e)
        else:
            why = (getattr(first, "reason", "") or getattr(first, "error", "") or "") if not first.ok else ""
            if not (retries and (why.startswith("oom:") or (why.startswith("crash:") and "SIGKILL" in why))):
                return first
        _add_phase("retried-alone", 1)
        with self.owner.alone(on_start=self._shed_idle_children):
            rep = attempt()
        extra = {"seconds": (getattr(first, "seconds", 0) or 0) + (rep.seconds or 0)} if hasattr(rep, "seconds") else {}
        if hasattr(rep, "gpu_seconds"):
            extra["gpu_seconds"] = (getattr(first, "gpu_seconds", 0) or 0) + (rep.gpu_seconds or 0)
        note = f"first attempt beside other candidates: {why[:300]}; retried with the device to itself\n"
        extra["log_key"] = self._log(note + (self.store.get_text(rep.log_key) if rep.log_key else ""))
        return rep.model_copy(update=extra)

    def _shed_idle_children(self) -> None:
        """Before a stage retried alone: the warm spares and the children kept between stages closed, so
        that the memory they hold (on the H200, 84 processes once held all 140 GiB) is the stage's; they
        are made again as needed."""
        try:
            _add_phase("shed-children", self.pool.shed() + self.loaded.shed())
        except Exception as e:  # noqa: BLE001 - the retry runs anyway, beside what could not be closed
            print(f"shedding idle children failed: {type(e).__name__}: {e}", flush=True)

    def _rules(self, source: str, problem: str):
        if not self.static_rules:
            return
        rep = check_source(source, problem)
        if not rep.ok:
            raise Rejection("rules", f"{rep.rule}: {rep.detail}")

    def warm(self, problem_name: str, shape_name: str | None = None, hb: Heartbeat = None,
             light: bool = False) -> dict:
        """Worker start-up: measure the ceilings and compute the oracle bank for every (distribution, seed)
        of the seed pool, so that no candidate's verification pays for a first oracle. `light` (a shape
        only a would-be best's checks visit): the reference child and one case per distribution, whose
        baseline's first call autotunes (into Triton's cache), no ceilings, no timing sets."""
        if light:
            return self._warm_light(problem_name, shape_name, hb)
        _waiting_heartbeat(hb)
        t0 = time.monotonic()
        problem = self._problem(problem_name)
        shape = self._shape(problem, shape_name)
        # where the warm-up's time goes (about 130 s for KDA, most of it FLA's first call): returned
        # per part, and per case by the reference child (inputs, oracle, baseline), for the worker's log
        parts: dict[str, float] = {}
        t = time.monotonic()
        ref_sb, ref_lock, _ = self._ref(problem, shape, hb)
        parts["reference-child"] = time.monotonic() - t
        t = time.monotonic()
        self.ensure_ceilings(problem, shape, hb)
        parts["ceilings"] = time.monotonic() - t
        cases = [(d, s) for s in range(self.settings.seed_pool) for d in problem.distributions]
        t = time.monotonic()
        for i in range(0, len(cases), 4):
            self.reference(problem, shape, cases[i:i + 4], hb, timing=True)
        parts["oracles"] = time.monotonic() - t
        per_case = {}
        with self._ref_meta_lock:
            for d, s_ in cases:
                meta = self._ref_meta.get((problem.name, shape.name, d, s_))
                for k, v in (meta.timing if meta is not None else {}).items():
                    per_case[k] = per_case.get(k, 0.0) + v
        parts.update({f"oracles.{k}": v for k, v in per_case.items()})
        # the timing sets as well: generated here, they reach the input bank before any benchmark needs them
        t = time.monotonic()
        for dist in problem.distributions:
            with self._with_ref(ref_lock):
                self._ref_do(ref_sb, hb, self._timing_set_request(dist), self.timeouts["load"])
        parts["timing-sets"] = time.monotonic() - t
        return {"problem": problem_name, "shape": shape.name, "oracles": len(cases), "seconds": time.monotonic() - t0,
                "parts": {k: round(v, 1) for k, v in parts.items()}}

    def _warm_light(self, problem_name: str, shape_name: str | None, hb: Heartbeat) -> dict:
        t0 = time.monotonic()
        problem = self._problem(problem_name)
        shape = self._shape(problem, shape_name)
        cases = [(d, 0) for d in problem.distributions]
        # in a timing block, as the primary shape's bank: the baseline's autotuning is kept on disk, so it
        # must not be measured beside other work
        refs = self.reference(problem, shape, cases, hb, timing=bool(self.cuda))
        return {"problem": problem_name, "shape": shape.name, "oracles": len(cases), "seconds": time.monotonic() - t0,
                "parts": {"cached": sum(1 for r in refs if "cached" in r.timing)}}

    def warm_shapes(self, problem_name: str, shapes: list[str], keep: str | None = None,
                    hb: Heartbeat = None) -> list[dict]:
        """Worker start-up (MARATHON_WARM_ALL_SHAPES): each of `shapes` warmed lightly (warm(light=True)),
        then its reference child closed, all but `keep`'s (the shape a would-be best is verified at next,
        whose child stays for it): what stays is on disk, in the caches, not on the device."""
        out = []
        for name in shapes:
            out.append(self.warm(problem_name, name, hb, light=True))
            if name != keep:
                self.close_reference(problem_name, name)
        return out

    def close_reference(self, problem_name: str, shape_name: str) -> bool:
        """Close the reference child of (problem, shape), if one runs; a later call starts another."""
        with self._refs_lock:
            entry = self._refs.pop((problem_name, shape_name), None)
        if entry is not None:
            with entry[1]:  # after the call it may be serving
                entry[0].close(graceful=True, grace_s=REFERENCE_GRACE_S)
        return entry is not None

    # --- profile ---------------------------------------------------------------------------------
    def profile(self, req: EvalRequest, hb: Heartbeat = None) -> ProfileReport:
        _waiting_heartbeat(hb)
        from gpu_worker.profile import profile_candidate

        return profile_candidate(self, req, hb)

    # --- self-test -------------------------------------------------------------------------------
    def selftest(self, hb: Heartbeat = None, reuse: bool = False) -> dict:
        """Run the canaries (gpu_worker.canaries) and settle `selftest_verdict` with their result, replacing
        any earlier one: a pass lifts a refusal, a failure imposes one. A self-test that raises settles
        nothing. A pass is kept on disk (SelfTestRecord); with `reuse` (a worker's start) a kept pass of
        this harness on this host and GPU model settles the verdict instead of the canaries."""
        from gpu_worker.canaries import run_canaries
        from gpu_worker.selftest_verdict import SelfTestRecord

        record = SelfTestRecord(self.settings, self.cuda)
        result = record.load() if reuse else None
        if result is None:
            result = run_canaries(self, hb)
            record.store(result)
        self.selftest_verdict.settle(result)
        return result
